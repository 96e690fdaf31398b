import { createLogger } from "@tollgate/kit/log";
import { onShutdown } from "@tollgate/kit/shutdown";
import { releaseStartupMemory } from "@tollgate/kit/startup-memory";
import { initTracing } from "@tollgate/kit/tracing";
import { start } from "./app.js";
import { loadConfig } from "./config.js";

const config = loadConfig();
const log = createLogger({ service: "api-edge", level: config.logLevel });
await initTracing(config.tracing, log);
const app = await start(config, log);
onShutdown(app, log, config.shutdownTimeoutMs);
releaseStartupMemory();

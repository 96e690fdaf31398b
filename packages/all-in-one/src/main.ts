import { createLogger } from "@tollgate/kit/log";
import { onShutdown } from "@tollgate/kit/shutdown";
import { initTracing } from "@tollgate/kit/tracing";
import { startAllInOne } from "./app.js";
import { printBanner } from "./banner.js";
import { loadConfig } from "./config.js";

const config = loadConfig();
const log = createLogger({ service: "all-in-one", level: config.logLevel });
await initTracing(config.tracing, log);
const app = await startAllInOne(config);
printBanner(app, config);
onShutdown(app, log);

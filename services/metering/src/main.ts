import { createLogger } from "@tollgate/kit/log";
import { onShutdown } from "@tollgate/kit/shutdown";
import { start } from "./app.js";
import { loadConfig } from "./config.js";

const config = loadConfig();
const log = createLogger({ service: "metering", level: config.logLevel });
const app = await start(config, log);
onShutdown(app, log);

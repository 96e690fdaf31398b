import { createLogger } from "@tollgate/kit/log";
import { onShutdown } from "@tollgate/kit/shutdown";
import { startAllInOne } from "./app.js";
import { printBanner } from "./banner.js";
import { loadConfig } from "./config.js";

const config = loadConfig();
const app = await startAllInOne(config);
printBanner(app, config);
onShutdown(app, createLogger({ service: "all-in-one", level: config.logLevel }));

import { runService } from "@tollgate/kit/run";
import { start } from "./app.js";
import { loadConfig } from "./config.js";

await runService("api-edge", () => loadConfig(), start);

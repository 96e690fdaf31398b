import { createLogger } from "@tollgate/kit/log";
import { onShutdown } from "@tollgate/kit/shutdown";
import { initTracing } from "@tollgate/kit/tracing";
import { type AllInOne, startAllInOne } from "./app.js";
import { describeStartupError, printBanner } from "./banner.js";
import { type AllInOneConfig, loadConfig } from "./config.js";

let config: AllInOneConfig | undefined;
let app: AllInOne;
try {
  config = loadConfig();
  const log = createLogger({ service: "all-in-one", level: config.logLevel });
  await initTracing(config.tracing, log);
  app = await startAllInOne(config);
  onShutdown(app, log);
} catch (err) {
  // One readable message, no stack: the services that did start hold sockets open, so exit
  // explicitly rather than wait for them.
  process.stderr.write(`${describeStartupError(err, config)}\n`);
  process.exit(1);
}
printBanner(app, config);

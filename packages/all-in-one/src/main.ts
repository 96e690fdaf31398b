import { setFlagsFromString } from "node:v8";
import { createLogger } from "@tollgate/kit/log";
import { onShutdown } from "@tollgate/kit/shutdown";
import { initTracing } from "@tollgate/kit/tracing";
import { type AllInOne, startAllInOne } from "./app.js";
import { describeStartupError, printBanner } from "./banner.js";
import { type AllInOneConfig, loadConfig } from "./config.js";

// The old generation grows by half its live size before a full collection, not by up to four
// times (V8's choice on a machine with gigabytes to spare when allocation outpaces collection):
// under sustained load most of what a request allocates is garbage by the next collection, and
// with the default factor the all-in-one's RSS kept rising with the little it keeps (reservations
// and event ids of their windows). See docs/performance.md, "All-in-one: memory". Read at every
// collection, so setting it here, once the process runs, holds for `npm start`, tsx and the bundle.
setFlagsFromString("--heap-growing-percent=50");

let config: AllInOneConfig | undefined;
let app: AllInOne;
try {
  config = loadConfig();
  const log = createLogger({ service: "all-in-one", level: config.logLevel });
  await initTracing(config.tracing, log);
  app = await startAllInOne(config);
  onShutdown(app, log, config.shutdownTimeoutMs);
} catch (err) {
  // One readable message, no stack: the services that did start hold sockets open, so exit
  // explicitly rather than wait for them.
  process.stderr.write(`${describeStartupError(err, config)}\n`);
  process.exit(1);
}
printBanner(app, config);

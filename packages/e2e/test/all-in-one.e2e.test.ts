import { describeAccountDoor, type Target } from "./account-door.js";
import { spawnAllInOne } from "./gateways.js";

/**
 * Starts the all-in-one process exactly as `npm start` does, on embedded defaults (no Redis,
 * no NATS, bundled fake upstream), and reads the demo key from the banner it prints.
 */
async function startAllInOneProcess(): Promise<Target> {
  const gateway = await spawnAllInOne();
  const key = /demo key: (\S+)/.exec(gateway.stderr())?.[1];
  if (!key) throw new Error(`no demo key in the banner:\n${gateway.stderr()}`);
  return {
    url: `http://127.0.0.1:${gateway.port}`,
    key,
    // Logs go to stdout; the banner (with the demo key, on purpose) goes to stderr.
    logs: () => gateway.stdout(),
    stop: () => gateway.stop(),
  };
}

describeAccountDoor("all-in-one process on embedded defaults", startAllInOneProcess);

import { spawn } from "node:child_process";
import { connect, type Socket } from "node:net";
import { sleep } from "./stats.js";

// What a process that sleeps and wakes costs on this machine, printed at the start of every run
// so that runs on different machines can be read side by side (docs/performance.md, "Latest
// run"): the stack's request at 1 connection wakes a sleeping process at every hop, Portkey's and
// the all-in-one's about half as often. One TCP loopback round trip at a time between this process
// and a child Node process echoing 300 bytes, the CPU this side spends per round trip (user +
// system), back to back and with 1 ms asleep before each.

/** The child: echoes whatever it reads, prints its port once listening. */
const ECHO = `const s = require("node:net").createServer((c) => { c.setNoDelay(true); c.on("data", (d) => c.write(d)); });
s.listen(0, "127.0.0.1", () => process.stdout.write(String(s.address().port) + "\\n"));`;

export interface WakeCost {
  /** Caller CPU per round trip, back to back (µs). */
  backToBackUs: number;
  /** Caller CPU per round trip with 1 ms asleep before each (µs). */
  afterIdleUs: number;
}

/** CPU (µs) this process spends per round trip over `n` round trips, waiting `gapMs` before each. */
async function perRoundTrip(socket: Socket, n: number, gapMs: number): Promise<number> {
  const message = Buffer.alloc(300, 0x61);
  const before = process.cpuUsage();
  for (let i = 0; i < n; i++) {
    if (gapMs > 0) await sleep(gapMs);
    await new Promise<void>((resolve, reject) => {
      let got = 0;
      const onData = (d: Buffer) => {
        got += d.length;
        if (got < message.length) return;
        socket.off("data", onData).off("error", reject);
        resolve();
      };
      socket.on("data", onData).once("error", reject);
      socket.write(message);
    });
  }
  const used = process.cpuUsage(before);
  return (used.user + used.system) / n;
}

/** Measures the wake-up cost; about half a second. Undefined when the probe could not run. */
export async function wakeCost(): Promise<WakeCost | undefined> {
  const child = spawn(process.execPath, ["-e", ECHO], { stdio: ["ignore", "pipe", "ignore"] });
  try {
    const port = await new Promise<number>((resolve, reject) => {
      child.stdout.once("data", (d: Buffer) => resolve(Number(d.toString().trim())));
      child.once("error", reject);
      child.once("exit", () => reject(new Error("the echo process exited")));
    });
    const socket = connect(port, "127.0.0.1");
    socket.setNoDelay(true);
    // Bounded: a probe that stalls gives no figure rather than holding the run.
    socket.setTimeout(5_000, () => socket.destroy(new Error("the wake-up probe stalled")));
    await new Promise<void>((resolve, reject) => socket.once("connect", resolve).once("error", reject));
    socket.on("error", () => {}); // a round trip in flight sees it through its own listener
    try {
      await perRoundTrip(socket, 500, 0); // warm-up
      const backToBackUs = await perRoundTrip(socket, 2_000, 0);
      const afterIdleUs = await perRoundTrip(socket, 300, 1);
      return { backToBackUs, afterIdleUs };
    } finally {
      socket.destroy();
    }
  } catch {
    return undefined;
  } finally {
    child.kill();
  }
}

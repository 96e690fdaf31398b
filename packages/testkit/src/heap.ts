import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

// gc() without starting the test process with --expose-gc: the flag, set now, makes a fresh
// context expose it.
setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

/**
 * The live heap, in bytes per item, that `fill` adds: measured after a full garbage collection
 * before and after it. What `fill` stores must stay reachable from the caller (keep the
 * structure under test in a variable used afterwards), and what the items are made of (their
 * ids, their messages) should be made before, so that only the structure's own cost is counted.
 */
export async function heapBytesPerItem(items: number, fill: () => Promise<void> | void): Promise<number> {
  gc();
  const before = process.memoryUsage().heapUsed;
  await fill();
  gc();
  return (process.memoryUsage().heapUsed - before) / items;
}

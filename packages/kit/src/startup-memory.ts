/**
 * Start-up leaves a process holding memory it no longer uses: V8 grows its young generation while
 * modules load and keeps it grown, and keeps freed pages for later. One memory-reducing full
 * garbage collection once the service is up (V8's "last resort" flavour: it collects until
 * nothing more is freed, shrinks the young generation and releases the freed pages) brings an
 * idle replica down to what it uses: 10–25 MB less per service (docs/performance.md, "Idle memory
 * per service"). It runs once, before the first request, and never on the request path. V8
 * regrows a shrunken young generation only slowly, collecting more often meanwhile: the
 * topology's `--min-semi-space-size` keeps it at the size load needs (its empty pages cost no RSS).
 *
 * It needs node's `--expose-gc`, which every service's node flags carry (the topology in
 * packages/config/src/topology.ts, which the images and the bench start them with). Without it
 * (a service run from source), nothing happens.
 */

/** V8's gc() of `--expose-gc`, with the options Node's V8 takes. */
type ExposedGc = (options?: {
  type?: "major" | "minor";
  execution?: "sync" | "async";
  flavor?: string;
}) => unknown;

/** Collects once as described above; false when the process was started without `--expose-gc`. */
export function releaseStartupMemory(): boolean {
  const gc = (globalThis as { gc?: ExposedGc }).gc;
  if (typeof gc !== "function") return false;
  gc({ type: "major", execution: "sync", flavor: "last-resort" });
  return true;
}

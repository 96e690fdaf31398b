import { createWriteStream, readFileSync } from "node:fs";
import { sleep } from "./stats.js";

/** process.memoryUsage() of the gateway process, in MiB. */
export interface HeapFigures {
  rss: number;
  heapTotal: number;
  heapUsed: number;
  external: number;
  arrayBuffers: number;
  /** V8's spaces: committed size (MiB) of the young generation and of the old generation. */
  newSpace: number;
  oldSpace: number;
}

/**
 * A DevTools-protocol session with a process started with `--inspect=127.0.0.1:<port>`: reads
 * its process.memoryUsage(), forces a full garbage collection and writes heap snapshots, for the
 * all-in-one memory probe (bench/all-in-one.ts). Only Runtime.evaluate and HeapProfiler are used:
 * no domain is enabled, so the session keeps nothing of the process alive.
 */
export class Inspector {
  #next = 1;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  #onChunk: ((chunk: string) => void) | undefined;

  private constructor(private readonly ws: WebSocket) {
    ws.addEventListener("message", (ev) => {
      const msg = JSON.parse(String(ev.data)) as {
        id?: number;
        result?: unknown;
        error?: { message: string };
        method?: string;
        params?: { chunk?: string };
      };
      if (msg.method === "HeapProfiler.addHeapSnapshotChunk") this.#onChunk?.(msg.params?.chunk ?? "");
      if (msg.id === undefined) return;
      const p = this.#pending.get(msg.id);
      this.#pending.delete(msg.id);
      if (msg.error) p?.reject(new Error(msg.error.message));
      else p?.resolve(msg.result);
    });
  }

  /** Connects to the inspector the process announced in its log ("Debugger listening on ws://..."). */
  static async attach(logFile: string, timeoutMs = 30_000): Promise<Inspector> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const url = /Debugger listening on (ws:\/\/\S+)/.exec(readFileSync(logFile, "utf8"))?.[1];
      if (url) {
        const ws = new WebSocket(url);
        await new Promise<void>((resolve, reject) => {
          ws.addEventListener("open", () => resolve(), { once: true });
          ws.addEventListener("error", () => reject(new Error(`cannot connect to ${url}`)), { once: true });
        });
        return new Inspector(ws);
      }
      if (Date.now() > deadline) throw new Error(`no inspector announced in ${logFile}`);
      await sleep(100);
    }
  }

  call(method: string, params: Record<string, unknown> = {}): Promise<unknown> {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ id, method, params }));
    });
  }

  async memory(): Promise<HeapFigures> {
    const r = (await this.call("Runtime.evaluate", {
      expression: `JSON.stringify({
        ...process.memoryUsage(),
        spaces: process.getBuiltinModule("node:v8").getHeapSpaceStatistics(),
      })`,
      returnByValue: true,
    })) as { result: { value: string } };
    const m = JSON.parse(r.result.value) as Record<keyof HeapFigures, number> & {
      spaces: Array<{ space_name: string; space_size: number }>;
    };
    const mb = (v: number) => Math.round((v / 2 ** 20) * 10) / 10;
    const space = (name: string) => m.spaces.find((s) => s.space_name === name)?.space_size ?? 0;
    return {
      rss: mb(m.rss),
      heapTotal: mb(m.heapTotal),
      heapUsed: mb(m.heapUsed),
      external: mb(m.external),
      arrayBuffers: mb(m.arrayBuffers),
      newSpace: mb(space("new_space")),
      oldSpace: mb(space("old_space")),
    };
  }

  /** A full, synchronous garbage collection (what `--expose-gc`'s gc() does). */
  async gc(): Promise<void> {
    await this.call("HeapProfiler.collectGarbage");
  }

  /** Writes a heap snapshot (after a full collection, as DevTools takes one) to `file`. */
  async snapshot(file: string): Promise<void> {
    const out = createWriteStream(file);
    this.#onChunk = (chunk) => out.write(chunk);
    try {
      await this.call("HeapProfiler.takeHeapSnapshot", { reportProgress: false });
    } finally {
      this.#onChunk = undefined;
      await new Promise<void>((resolve) => out.end(resolve));
    }
  }

  close(): void {
    this.ws.close();
  }
}

/** Live objects of a heap snapshot by constructor (or kind): count and self size. */
export type HeapCensus = Map<string, { count: number; bytes: number }>;

/** Counts a heap snapshot's nodes by type and name (objects by constructor, strings, closures…). */
export function census(file: string): HeapCensus {
  const snap = JSON.parse(readFileSync(file, "utf8")) as {
    snapshot: { meta: { node_fields: string[]; node_types: [string[]] } };
    nodes: number[];
    strings: string[];
  };
  const fields = snap.snapshot.meta.node_fields;
  const types = snap.snapshot.meta.node_types[0];
  const width = fields.length;
  const typeAt = fields.indexOf("type");
  const nameAt = fields.indexOf("name");
  const sizeAt = fields.indexOf("self_size");
  const out: HeapCensus = new Map();
  for (let i = 0; i < snap.nodes.length; i += width) {
    const type = types[snap.nodes[i + typeAt]!]!;
    const name = snap.strings[snap.nodes[i + nameAt]!]!;
    // Strings and numbers by kind (their names are their values); objects by constructor.
    const label =
      type === "object" || type === "closure" || type === "native"
        ? `${type}:${name.slice(0, 60)}`
        : `(${type})`;
    const e = out.get(label) ?? { count: 0, bytes: 0 };
    e.count++;
    e.bytes += snap.nodes[i + sizeAt]!;
    out.set(label, e);
  }
  return out;
}

/** What grew from one census to the next, largest growth in bytes first. */
export function growth(
  before: HeapCensus,
  after: HeapCensus,
  top = 25,
): Array<{ label: string; count: number; bytes: number }> {
  const rows: Array<{ label: string; count: number; bytes: number }> = [];
  for (const [label, a] of after) {
    const b = before.get(label) ?? { count: 0, bytes: 0 };
    rows.push({ label, count: a.count - b.count, bytes: a.bytes - b.bytes });
  }
  return rows.sort((x, y) => y.bytes - x.bytes).slice(0, top);
}

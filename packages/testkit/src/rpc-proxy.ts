import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";

/**
 * What the proxy does with a JSON-RPC call:
 * - `pass`: forwards it and relays the answer;
 * - `fail`: answers HTTP `status` (default 503) without forwarding: the node never sees it;
 * - `drop`: closes the connection without an answer; with `forward` the node gets the call
 *   first (it acts, the reply is lost), without it the node never sees it;
 * - `delay`: forwards at once and relays the answer `ms` later (the node acts on time, the
 *   reply is slow; a caller that gives up earlier never sees it).
 */
export type RpcFault =
  | { kind: "pass" }
  | { kind: "fail"; status?: number }
  | { kind: "drop"; forward?: boolean }
  | { kind: "delay"; ms: number };

/** One JSON-RPC call as the proxy handled it. */
export interface RpcProxyCall {
  method: string;
  fault: RpcFault["kind"];
}

/** A fault-injecting HTTP proxy in front of a JSON-RPC node (the Tempo devnet). */
export interface RpcProxy {
  /** http://127.0.0.1:<port> */
  url: string;
  /** Sets the fault of one JSON-RPC method, or of every method without its own with "*". */
  set(method: string, fault: RpcFault): void;
  /** Every method back to `pass`. */
  reset(): void;
  /** Every call so far, in arrival order. */
  readonly calls: readonly RpcProxyCall[];
  close(): Promise<void>;
}

/** Options of the proxy. */
export interface RpcProxyOptions {
  /** The node's URL; it need not be up yet (each call is forwarded when it comes). */
  target: string;
  host?: string;
  /** Default: a free port. */
  port?: number;
}

const PASS: RpcFault = { kind: "pass" };

/** The methods of a JSON-RPC body (one call or a batch); empty when it is not JSON-RPC. */
function methodsOf(body: string): string[] {
  try {
    const parsed = JSON.parse(body) as unknown;
    const calls = Array.isArray(parsed) ? parsed : [parsed];
    return calls
      .map((c) => (c as { method?: unknown } | null)?.method)
      .filter((m): m is string => typeof m === "string");
  } catch {
    return [];
  }
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

/**
 * Starts the proxy on 127.0.0.1. A batch takes the fault of its first method that has one;
 * faults are set per method while the proxy runs, so a test can break and heal the chain
 * between two steps of one payment session.
 */
export async function startRpcProxy(opts: RpcProxyOptions): Promise<RpcProxy> {
  const faults = new Map<string, RpcFault>();
  const calls: RpcProxyCall[] = [];
  const sockets = new Set<Socket>();
  const timers = new Set<NodeJS.Timeout>();

  const faultOf = (methods: string[]): RpcFault => {
    for (const m of methods) {
      const f = faults.get(m);
      if (f && f.kind !== "pass") return f;
    }
    return faults.get("*") ?? PASS;
  };

  const forward = (body: Buffer) =>
    fetch(opts.target, { method: "POST", headers: { "content-type": "application/json" }, body });

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const body = await readBody(req);
    const methods = methodsOf(body.toString("utf8"));
    const fault = faultOf(methods);
    for (const method of methods) calls.push({ method, fault: fault.kind });
    if (fault.kind === "fail") {
      res.writeHead(fault.status ?? 503, { "content-type": "text/plain" }).end("injected failure");
      return;
    }
    if (fault.kind === "drop") {
      if (fault.forward) await forward(body).then((r) => r.arrayBuffer());
      req.socket.destroy();
      return;
    }
    const answer = await forward(body);
    const text = Buffer.from(await answer.arrayBuffer());
    if (fault.kind === "delay") {
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          timers.delete(t);
          resolve();
        }, fault.ms);
        timers.add(t);
      });
    }
    if (res.destroyed) return;
    res.writeHead(answer.status, {
      "content-type": answer.headers.get("content-type") ?? "application/json",
    });
    res.end(text);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch(() => {
      // The node is down or the caller left: a dropped connection, as a dead node would give.
      req.socket.destroy();
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, opts.host ?? "127.0.0.1", () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    set: (method, fault) => {
      faults.set(method, fault);
    },
    reset: () => faults.clear(),
    calls,
    close: () =>
      new Promise<void>((resolve) => {
        for (const t of timers) clearTimeout(t);
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

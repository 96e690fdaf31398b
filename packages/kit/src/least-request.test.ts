import type { Server } from "@grpc/grpc-js";
import { InferenceService } from "@tollgate/proto/inference";
import pino from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { addService, bindServer, createClient, createServer, GrpcStatus, StatusError } from "./grpc.js";
import { choose, FAILED_HOLD_MS, PREFERENCE_MS } from "./least-request.js";

const decoder = new TextDecoder();

/** A replica: answers Complete with its name after `delayMs`, or UNAVAILABLE while `failing`. */
async function replica(name: string, opts: { delayMs?: number } = {}) {
  const state = { failing: false, calls: 0 };
  const server = createServer();
  addService(
    server,
    InferenceService,
    {
      async complete() {
        state.calls++;
        if (state.failing) throw new StatusError(GrpcStatus.UNAVAILABLE, "unavailable", "not now");
        if (opts.delayMs) await new Promise((r) => setTimeout(r, opts.delayMs));
        return { body: new TextEncoder().encode(name) };
      },
      async *streamComplete() {},
    },
    pino({ level: "silent" }),
  );
  const port = await bindServer(server, "127.0.0.1", 0);
  servers.push(server);
  return { name, port, server, state };
}

const servers: Server[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.forceShutdown();
});

async function twoReplicas(delayMs?: number) {
  const a = await replica("a", { delayMs });
  const b = await replica("b", { delayMs });
  const client = createClient(InferenceService, `127.0.0.1:${a.port},127.0.0.1:${b.port}`);
  // Both connections up before the first call, as a running api-edge has them.
  await client.$ready(5_000);
  await new Promise((r) => setTimeout(r, 100));
  const call = async () => {
    try {
      return decoder.decode((await client.complete({})).body);
    } catch {
      return "failed";
    }
  };
  return { a, b, client, call };
}

describe("spreading calls over replicas (fewest in flight)", () => {
  it("sends calls made one at a time to one replica, which stays warm", async () => {
    const { client, call } = await twoReplicas();
    const served: string[] = [];
    for (let i = 0; i < 20; i++) served.push(await call());
    client.$close();
    // Round-robin alternated a, b, a, b: each replica woke for every other call. (The preferred
    // replica may move once within the 20 calls.)
    const switches = served.filter((s, i) => i > 0 && s !== served[i - 1]).length;
    expect(switches).toBeLessThanOrEqual(1);
  });

  it("spreads calls that overlap over both replicas, evenly", async () => {
    const { client, call } = await twoReplicas(30);
    const served = await Promise.all(Array.from({ length: 20 }, call));
    client.$close();
    const count = (n: string) => served.filter((s) => s === n).length;
    expect(count("a")).toBe(10);
    expect(count("b")).toBe(10);
  });

  it("moves calls to the other replica when the preferred one stops", async () => {
    const { a, b, client, call } = await twoReplicas();
    const home = (await call()) === "a" ? a : b;
    const other = home === a ? b : a;
    home.server.forceShutdown();
    await new Promise((r) => setTimeout(r, 200));
    const served: string[] = [];
    for (let i = 0; i < 5; i++) served.push(await call());
    client.$close();
    expect(served).toEqual(Array(5).fill(other.name));
  });

  it("passes over a replica that answers UNAVAILABLE while the other serves", async () => {
    const { a, b, client, call } = await twoReplicas();
    const home = (await call()) === "a" ? a : b;
    const other = home === a ? b : a;
    home.state.failing = true;
    const served: string[] = [];
    for (let i = 0; i < 10; i++) served.push(await call());
    client.$close();
    // One call meets the failure; the next ones go to the replica that answers.
    expect(served[0]).toBe("failed");
    expect(served.slice(1)).toEqual(Array(9).fill(other.name));
    expect(home.state.calls).toBe(2);
  });
});

describe("choose", () => {
  // A moment at which the first entry is the preferred one.
  const now = 1_000 * PREFERENCE_MS * 6;
  it("takes the fewest in flight, the preferred one of equals", () => {
    const r = [
      { id: 1, inFlight: 2, failedAt: 0 },
      { id: 2, inFlight: 1, failedAt: 0 },
      { id: 3, inFlight: 1, failedAt: 0 },
    ];
    expect(choose(r, now)?.id).toBe(2);
    expect(choose([r[1]!, r[2]!], now)?.id).toBe(2);
    expect(choose([], now)).toBeUndefined();
  });

  it("moves the preference to the next replica every PREFERENCE_MS, round the list", () => {
    const r = [1, 2, 3].map((id) => ({ id, inFlight: 0, failedAt: 0 }));
    const at = (k: number) => choose(r, now + k * PREFERENCE_MS + 1)?.id;
    expect([at(0), at(1), at(2), at(3)]).toEqual([1, 2, 3, 1]);
    // Busy beats preferred.
    r[1]!.inFlight = 1;
    expect(at(1)).toBe(3);
  });

  it("passes over a replica that failed within the hold, unless none other is ready", () => {
    const failed = { id: 1, inFlight: 0, failedAt: now - 10 };
    const busy = { id: 2, inFlight: 5, failedAt: 0 };
    expect(choose([failed, busy], now)?.id).toBe(2);
    expect(choose([failed], now)?.id).toBe(1);
    expect(choose([failed, busy], now + FAILED_HOLD_MS)?.id).toBe(1);
  });
});

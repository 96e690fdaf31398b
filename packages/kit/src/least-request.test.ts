import { experimental, type Server } from "@grpc/grpc-js";
import { InferenceService } from "@tollgate/proto/inference";
import pino from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { addService, bindServer, createClient, createServer, GrpcStatus, StatusError } from "./grpc.js";
import { choose, FAILED_HOLD_MS, PREFERENCE_MS } from "./least-request.js";

const decoder = new TextDecoder();

/**
 * A replica: answers Complete with its name after `delayMs`, or UNAVAILABLE while `failing`; a
 * call for the model "hold" waits until `release()`.
 */
async function replica(name: string, opts: { delayMs?: number } = {}) {
  let release = () => {};
  const held = new Promise<void>((r) => {
    release = r;
  });
  const state = { failing: false, calls: 0, release };
  const server = createServer();
  addService(
    server,
    InferenceService,
    {
      async complete(req) {
        state.calls++;
        if (state.failing) throw new StatusError(GrpcStatus.UNAVAILABLE, "unavailable", "not now");
        if (req.input?.model === "hold") await held;
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

type Replica = Awaited<ReturnType<typeof replica>>;

/**
 * Replicas "a" and "b" and a client of both, connected. `address` names them to the client: by
 * default a comma list of their addresses.
 */
async function twoReplicas(opts: { delayMs?: number; address?: (a: Replica, b: Replica) => string } = {}) {
  const a = await replica("a", opts);
  const b = await replica("b", opts);
  const address = opts.address ?? (() => `127.0.0.1:${a.port},127.0.0.1:${b.port}`);
  const client = createClient(InferenceService, address(a, b));
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
    const { client, call } = await twoReplicas({ delayMs: 30 });
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

/** Resolves the test's "replicas:///" names to `endpoints`, and again each time `again()` runs. */
const resolved = {
  endpoints: [] as Array<{ addresses: Array<{ host: string; port: number }> }>,
  again: [] as Array<() => void>,
};
class ReplicasResolver {
  constructor(
    _target: unknown,
    private readonly listener: (...args: unknown[]) => boolean,
  ) {
    resolved.again.push(() => this.report());
  }
  private report() {
    this.listener(experimental.statusOrFromValue(resolved.endpoints), {}, null, "");
  }
  updateResolution() {
    process.nextTick(() => this.report());
  }
  destroy() {}
  static getDefaultAuthority() {
    return "replicas";
  }
}
experimental.registerResolver(
  "replicas",
  ReplicasResolver as unknown as Parameters<typeof experimental.registerResolver>[1],
);

describe("a name resolved again (a Kubernetes headless Service)", () => {
  it("keeps counting the calls each replica has in flight", async () => {
    // The shuffle keeps the resolver's order; the preferred replica does not move mid-test.
    const random = vi.spyOn(Math, "random").mockReturnValue(0.999);
    const intoSlot = Date.now() % PREFERENCE_MS;
    if (intoSlot > PREFERENCE_MS - 2_000)
      await new Promise((r) => setTimeout(r, PREFERENCE_MS - intoSlot + 20));
    try {
      const { a, b, client } = await twoReplicas({
        address: (a, b) => {
          resolved.endpoints = [a, b].map((r) => ({ addresses: [{ host: "127.0.0.1", port: r.port }] }));
          resolved.again = [];
          return "replicas:///tollgate";
        },
      });
      const arrived = async (n: number) => {
        while (a.state.calls + b.state.calls < n) await new Promise((r) => setTimeout(r, 5));
      };
      const hold = () =>
        client.complete({ input: { model: "hold" } }).then((res) => decoder.decode(res.body));
      // Three held calls: the preferred replica takes two, the other one.
      const held = [hold()];
      await arrived(1);
      const busy = a.state.calls === 1 ? a : b;
      const other = busy === a ? b : a;
      held.push(hold());
      await arrived(2);
      held.push(hold());
      await arrived(3);
      expect([busy.state.calls, other.state.calls]).toEqual([2, 1]);

      // The name is resolved again, to the same replicas.
      for (const again of resolved.again) again();
      await new Promise((r) => setTimeout(r, 100));

      // A new call goes to the replica with fewer in flight. Counts that restarted at zero
      // (as round-robin's list does) sent it to the preferred, busier one.
      const served = decoder.decode((await client.complete({})).body);
      expect(served).toBe(other.name);
      a.state.release();
      b.state.release();
      expect((await Promise.all(held)).sort()).toEqual([busy.name, busy.name, other.name].sort());
      client.$close();
    } finally {
      random.mockRestore();
    }
  });
});

// The load balancing every gRPC client of the gateway uses across a service's replicas
// (docs/architecture.md, "Spreading calls over replicas"): each call goes to the ready replica
// with the fewest calls in flight from this client; among equals, to the preferred one, which
// moves to the next replica every PREFERENCE_MS, from an order shuffled once per address list
// so that clients prefer different replicas.
//
// Round-robin sent every other call to another replica even when one at a time was in flight,
// so at low load each replica woke for every second call with its caches cold: on the 2-core
// bench, one router taking the calls of one connection instead of two cut 0.2–0.6 ms off a
// request and about a quarter of the routers' CPU per request (docs/performance.md, "Least
// calls in flight"). Under load the counts even out, and a replica that falls behind gets
// fewer calls, not its share. The preference moves so that, at low load too, every replica
// keeps receiving calls (an idle replica's broken connection shows, and the alert for a
// replica that gets no calls keeps its meaning).
//
// A replica whose call ended UNAVAILABLE is passed over for FAILED_HOLD_MS while another is
// ready, so one that fails fast (and so has nothing in flight) does not draw every call.
import { connectivityState as ConnectivityState, experimental, status } from "@grpc/grpc-js";

/** The policy's name in a channel's service config. */
export const LEAST_REQUEST = "tollgate_least_request";

/** How long a replica whose call ended UNAVAILABLE is passed over while another is ready. */
export const FAILED_HOLD_MS = 1_000;

/** How long one replica stays the preferred one among equals before the next one is. */
export const PREFERENCE_MS = 5_000;

type Endpoint = Parameters<typeof experimental.endpointToString>[0];
type ChannelOptions = ConstructorParameters<typeof experimental.LeafLoadBalancer>[2];
type Helper = experimental.ChannelControlHelper;

class LeastRequestConfig implements experimental.TypedLoadBalancingConfig {
  getLoadBalancerName(): string {
    return LEAST_REQUEST;
  }
  toJsonObject(): object {
    return { [LEAST_REQUEST]: {} };
  }
  static createFromJson(): LeastRequestConfig {
    return new LeastRequestConfig();
  }
}

/** One replica: its connection (grpc-js's pick-first leaf) and this client's calls on it. */
interface Replica {
  leaf: experimental.LeafLoadBalancer;
  /**
   * Calls picked for it and started, not yet ended, plus calls picked and not yet started (a
   * call starts once its metadata is ready, after the picks of the same burst of requests).
   */
  inFlight: number;
  /** Of inFlight, the calls picked and not yet started; forgotten at the end of the tick. */
  picked: number;
  /** When a call on it last ended UNAVAILABLE (ms since the epoch); 0: never. */
  failedAt: number;
}

/**
 * Picks the ready replica to run a call on at `now`: the fewest in flight among those that did
 * not fail within FAILED_HOLD_MS (among all when every one did); among equals, the first from
 * the preferred one on, which is `ready`'s next entry every PREFERENCE_MS.
 */
export function choose<R extends Pick<Replica, "inFlight" | "failedAt">>(
  ready: readonly R[],
  now: number,
): R | undefined {
  const n = ready.length;
  const first = Math.floor(now / PREFERENCE_MS) % n;
  let best: R | undefined;
  let bestFailing = true;
  for (let i = 0; i < n; i++) {
    const r = ready[(first + i) % n]!;
    const failing = now - r.failedAt < FAILED_HOLD_MS;
    if (
      best === undefined ||
      (bestFailing && !failing) ||
      (failing === bestFailing && r.inFlight < best.inFlight)
    ) {
      best = r;
      bestFailing = failing;
    }
  }
  return best;
}

class LeastRequestPicker implements experimental.Picker {
  private forgetScheduled = false;
  constructor(private readonly ready: readonly Replica[]) {}

  pick(args: experimental.PickArgs): experimental.PickResult {
    const replica = choose(this.ready, Date.now())!;
    const result = replica.leaf.getPicker().pick(args);
    if (result.pickResultType !== experimental.PickResultType.COMPLETE) return result;
    replica.picked++;
    replica.inFlight++;
    // A pick whose call never starts (its connection dropped meanwhile: grpc-js picks again)
    // must not count for ever: what is still unstarted after this tick is forgotten.
    if (!this.forgetScheduled) {
      this.forgetScheduled = true;
      setImmediate(() => {
        this.forgetScheduled = false;
        for (const r of this.ready) {
          r.inFlight -= r.picked;
          r.picked = 0;
        }
      });
    }
    const started = result.onCallStarted;
    const ended = result.onCallEnded;
    return {
      ...result,
      onCallStarted: () => {
        // Still counted as picked in this tick: move it to started; else count it again.
        if (replica.picked > 0) replica.picked--;
        else replica.inFlight++;
        started?.();
      },
      onCallEnded: (code, details, metadata) => {
        replica.inFlight--;
        if (code === status.UNAVAILABLE) replica.failedAt = Date.now();
        ended?.(code, details, metadata);
      },
    };
  }
}

class LeastRequestBalancer implements experimental.LoadBalancer {
  private replicas: Replica[] = [];
  private state: ConnectivityState = ConnectivityState.IDLE;
  private updating = false;
  private lastError: string | null = null;
  private readonly childHelper: Helper;

  constructor(private readonly helper: Helper) {
    this.childHelper = experimental.createChildChannelControlHelper(helper, {
      updateState: (state, _picker, errorMessage) => {
        // A replica leaving READY (it ended, or its connection aged out) asks the resolver
        // again, so a Kubernetes headless name's new replicas are found (as round-robin does).
        if (this.state === ConnectivityState.READY && state !== ConnectivityState.READY)
          this.helper.requestReresolution();
        if (errorMessage) this.lastError = errorMessage;
        this.update();
      },
    });
  }

  updateAddressList(
    endpoints: Parameters<experimental.LoadBalancer["updateAddressList"]>[0],
    config: experimental.TypedLoadBalancingConfig,
    options: ChannelOptions,
    note: string,
  ): boolean {
    if (!(config instanceof LeastRequestConfig)) return false;
    if (!endpoints.ok) {
      if (this.replicas.length === 0)
        this.publish(
          ConnectivityState.TRANSIENT_FAILURE,
          new experimental.UnavailablePicker(endpoints.error),
          endpoints.error.details,
        );
      return true;
    }
    const list = shuffled(endpoints.value);
    if (list.length === 0) {
      for (const r of this.replicas) r.leaf.destroy();
      const message = `no addresses resolved: ${note}`;
      this.replicas = [];
      this.publish(
        ConnectivityState.TRANSIENT_FAILURE,
        new experimental.UnavailablePicker({ details: message }),
        message,
      );
      return true;
    }
    // A Kubernetes name is resolved again whenever a replica leaves READY (its connection ages
    // out every five minutes): a replica still listed keeps its record, so the calls it has in
    // flight (long streams) still count; its new leaf reuses the pooled connection.
    const kept = new Map(this.replicas.map((r) => [experimental.endpointToString(r.leaf.getEndpoint()), r]));
    const oldLeaves = this.replicas.map((r) => r.leaf);
    this.updating = true;
    this.replicas = list.map((endpoint: Endpoint) => {
      const leaf = new experimental.LeafLoadBalancer(endpoint, this.childHelper, options, note);
      const key = experimental.endpointToString(endpoint);
      const replica = kept.get(key);
      // Taken once: an address listed twice gets a record of its own for its second leaf.
      kept.delete(key);
      if (!replica) return { leaf, inFlight: 0, picked: 0, failedAt: 0 };
      replica.leaf = leaf;
      return replica;
    });
    for (const r of this.replicas) r.leaf.startConnecting();
    for (const leaf of oldLeaves) leaf.destroy();
    this.updating = false;
    this.update();
    return true;
  }

  /** The channel's state and picker from its replicas' states (as round-robin derives them). */
  private update(): void {
    if (this.updating) return;
    const inState = (s: ConnectivityState) =>
      this.replicas.filter((r) => r.leaf.getConnectivityState() === s);
    const ready = inState(ConnectivityState.READY);
    if (ready.length > 0) this.publish(ConnectivityState.READY, new LeastRequestPicker(ready), null);
    else if (inState(ConnectivityState.CONNECTING).length > 0)
      this.publish(ConnectivityState.CONNECTING, new experimental.QueuePicker(this), null);
    else if (inState(ConnectivityState.TRANSIENT_FAILURE).length > 0) {
      const message = `no replica is reachable; last error: ${this.lastError}`;
      this.publish(
        ConnectivityState.TRANSIENT_FAILURE,
        new experimental.UnavailablePicker({ details: message }),
        message,
      );
    } else this.publish(ConnectivityState.IDLE, new experimental.QueuePicker(this), null);
    // Every replica stays connected, so a call never waits for a connection to one.
    for (const r of this.replicas)
      if (r.leaf.getConnectivityState() === ConnectivityState.IDLE) r.leaf.exitIdle();
  }

  private publish(state: ConnectivityState, picker: experimental.Picker, error: string | null): void {
    this.state = state;
    this.helper.updateState(state, picker, error);
  }

  exitIdle(): void {}
  resetBackoff(): void {}
  destroy(): void {
    for (const r of this.replicas) r.leaf.destroy();
    this.replicas = [];
  }
  getTypeName(): string {
    return LEAST_REQUEST;
  }
}

/** A copy of `list` in random order (Fisher–Yates). */
function shuffled<T>(list: readonly T[]): T[] {
  const out = [...list];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

experimental.registerLoadBalancerType(LEAST_REQUEST, LeastRequestBalancer, LeastRequestConfig);

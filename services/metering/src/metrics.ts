import { Counter, Gauge, METRIC_PREFIX, type Registry } from "@tollgate/kit/metrics";
import { Door } from "@tollgate/proto/usage";
import type { PaidCommitOutcome } from "./domain/ports.js";
import type { UsageObserver } from "./transport/bus/usage-consumer.js";

const DOOR_LABEL: Readonly<Record<Door, string>> = {
  [Door.UNSPECIFIED]: "unspecified",
  [Door.ACCOUNT]: "account",
  [Door.PAID]: "paid",
};

/** metering's Prometheus instruments (docs/operations.md, "Metrics"); labels are closed sets only. */
export interface MeteringMetrics {
  /** Feeds the event counters from the usage consumer. */
  observe: UsageObserver;
  /** Counts what became of each paid hold committed from its usage event. */
  observePaidCommit: (outcome: PaidCommitOutcome) => void;
}

/**
 * Registers metering's metrics on `registry`. The lag gauge asks `pending` on every scrape, so
 * it is as fresh as the scrape; when the bus cannot answer, the last value stays.
 */
export function meteringMetrics(registry: Registry, pending: () => Promise<number>): MeteringMetrics {
  const registers = [registry];
  const events = new Counter({
    name: `${METRIC_PREFIX}usage_events_total`,
    help: "Usage events consumed, by outcome: recorded, duplicate (already applied) or invalid (dropped)",
    labelNames: ["outcome"],
    registers,
  });
  // Present from the start, so a rate() over them has a zero to begin from.
  for (const outcome of ["recorded", "duplicate", "invalid"]) events.inc({ outcome }, 0);
  // Named apart from the router's tollgate_cost_base_units_total{model,door} (cost priced and
  // published) so that the all-in-one process can serve both from one merged registry.
  const cost = new Counter({
    name: `${METRIC_PREFIX}metered_cost_base_units_total`,
    help: "Cost applied to the usage rollups in base units of the payment token (6 decimals), by door",
    labelNames: ["door"],
    registers,
  });
  const paidCommits = new Counter({
    name: `${METRIC_PREFIX}paid_commits_total`,
    help:
      "Paid-door holds committed from their usage events, by outcome: committed (charged now or " +
      "before, by api-edge's Commit) or unknown, released, expired (never to be charged)",
    labelNames: ["outcome"],
    registers,
  });
  for (const outcome of ["committed", "unknown", "released", "expired"]) paidCommits.inc({ outcome }, 0);
  new Gauge({
    name: `${METRIC_PREFIX}consumer_lag_messages`,
    help: "Usage events published but not yet applied by the metering consumer",
    registers,
    async collect() {
      try {
        this.set(await pending());
      } catch {
        // The bus is unreachable: keep the last value rather than fail the whole scrape.
      }
    },
  });
  return {
    observe(outcome, message) {
      events.inc({ outcome });
      // Metrics are not money records: Number() may round a huge amount, which is fine for a
      // dashboard rate. Spend of record is the bigint rollups. A duplicate adds nothing.
      if (outcome === "recorded" && message) {
        const value = Number(message.cost);
        if (Number.isFinite(value) && value >= 0)
          cost.inc({ door: DOOR_LABEL[message.door] ?? "unspecified" }, value);
      }
    },
    observePaidCommit(outcome) {
      paidCommits.inc({ outcome });
    },
  };
}

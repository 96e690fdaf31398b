import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { Handlers } from "@tollgate/kit/grpc";
import { Granularity as GranularityPb, type MeteringService } from "@tollgate/proto/metering";
import type { UsageRecorded } from "@tollgate/proto/usage";
import { MeteringError } from "../../domain/errors.js";
import type { UsageStore } from "../../domain/ports.js";
import { type Granularity, resolveUsageQuery, type UsageTotals } from "../../domain/usage.js";
import { toUsageEvent } from "../bus/usage-consumer.js";
import { toStatusError } from "./errors.js";

function granularityOf(g: GranularityPb): Granularity | undefined {
  switch (g) {
    case GranularityPb.UNSPECIFIED:
      return undefined;
    case GranularityPb.HOUR:
      return "hour";
    case GranularityPb.DAY:
      return "day";
    default:
      throw new MeteringError("invalid_granularity", `unknown granularity ${g}`);
  }
}

function totalsMessage(t: UsageTotals) {
  return {
    requests: t.requests,
    inputTokens: t.inputTokens,
    outputTokens: t.outputTokens,
    reasoningTokens: t.reasoningTokens,
    cost: t.cost.toString(),
  };
}

/** Stores a usage event on the usage stream, deduplicated by its event id. */
export type UsageRecorder = (usage: UsageRecorded) => Promise<void>;

/** Maps MeteringService messages to the domain and back. */
export function meteringHandlers(
  store: UsageStore,
  now: () => Date = () => new Date(),
  record: UsageRecorder = async () => {
    throw new Error("no usage stream to record on");
  },
): Handlers<typeof MeteringService> {
  return {
    async recordUsage(req) {
      try {
        if (!req.usage) throw new MeteringError("invalid_usage_event", "usage is required");
        // Refuse what the consumer could not apply (it would drop it as invalid).
        toUsageEvent(req.usage);
        await record(req.usage);
        return {};
      } catch (err) {
        throw toStatusError(err);
      }
    },
    async getUsage(req) {
      try {
        const granularity = granularityOf(req.granularity);
        const q = resolveUsageQuery(
          {
            filter: {
              accountId: req.accountId,
              connectionId: req.connectionId,
              keyId: req.keyId,
              model: req.model,
            },
            ...(req.from ? { from: timestampDate(req.from) } : {}),
            ...(req.to ? { to: timestampDate(req.to) } : {}),
            ...(granularity ? { granularity } : {}),
            byModel: req.byModel,
          },
          now(),
        );
        const report = await store.query(q.filter, q.from, q.to, q.granularity, q.byModel);
        return {
          totals: totalsMessage(report.totals),
          buckets: report.buckets.map((b) => ({
            start: timestampFromDate(b.start),
            totals: totalsMessage(b.totals),
            model: b.model ?? "",
          })),
        };
      } catch (err) {
        throw toStatusError(err);
      }
    },
  };
}

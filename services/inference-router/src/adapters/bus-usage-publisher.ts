import { create, toBinary } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { EventBus } from "@tollgate/kit/bus";
import { Door, Outcome, UsageRecordedSchema } from "@tollgate/proto/usage";
import type { UsageEvent, UsagePublisher } from "../domain/ports.js";

const DOOR = { account: Door.ACCOUNT, paid: Door.PAID } as const;
const OUTCOME = {
  completed: Outcome.COMPLETED,
  client_cancelled: Outcome.CLIENT_CANCELLED,
  upstream_failed: Outcome.UPSTREAM_FAILED,
} as const;

const ATTEMPTS = 3;

/** Encodes UsageRecorded as protobuf and publishes it with the event id as message id, retrying. */
export function createBusUsagePublisher(bus: EventBus, subject: string): UsagePublisher {
  return {
    async publish(e: UsageEvent) {
      const data = toBinary(
        UsageRecordedSchema,
        create(UsageRecordedSchema, {
          eventId: e.eventId,
          occurredAt: timestampFromDate(e.occurredAt),
          requestId: e.requestId,
          door: DOOR[e.door],
          accountId: e.accountId,
          connectionId: e.connectionId,
          keyId: e.keyId,
          model: e.model,
          runtime: e.runtime,
          upstreamId: e.upstreamId,
          inputTokens: e.tokens.inputTokens,
          outputTokens: e.tokens.outputTokens,
          reasoningTokens: e.tokens.reasoningTokens,
          cost: e.cost.toString(),
          pricingSnapshotId: e.pricingSnapshotId,
          reservationId: e.reservationId,
          outcome: OUTCOME[e.outcome],
          streamed: e.streamed,
        }),
      );
      // The same message id on every attempt: JetStream stores a retried publish once.
      for (let attempt = 1; ; attempt++) {
        try {
          return await bus.publish(subject, data, e.eventId);
        } catch (err) {
          if (attempt >= ATTEMPTS) throw err;
          await new Promise((r) => setTimeout(r, 100 * 2 ** attempt));
        }
      }
    },
  };
}

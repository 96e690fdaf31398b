// Re-export of the generated tollgate.usage.v1 code (see proto/tollgate/usage/v1).
import { decodeMessage } from "./codec.js";
import {
  UsageBatchSchema,
  type UsageRecorded,
  UsageRecordedSchema,
} from "./gen/tollgate/usage/v1/usage_pb.js";
import { USAGE_BATCH_SUBJECT } from "./subjects.js";

export * from "./gen/tollgate/usage/v1/usage_pb.js";

/**
 * The usage events one message of the usage stream carries, by its subject: a UsageBatch's
 * events (`…tollgate.usage.v1.batch`), else the message as one UsageRecorded
 * (docs/architecture.md, "The bus"). Throws when the message cannot be decoded.
 */
export function usageEventsOf(subject: string, data: Uint8Array): UsageRecorded[] {
  return subject.endsWith(USAGE_BATCH_SUBJECT)
    ? decodeMessage(UsageBatchSchema, data).events
    : [decodeMessage(UsageRecordedSchema, data)];
}

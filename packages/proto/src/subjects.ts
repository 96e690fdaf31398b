// NATS names, defined once (docs/architecture.md, "The bus").

/** Base JetStream stream holding every usage event. */
export const USAGE_STREAM = "TOLLGATE_USAGE";
/** Base subject of the UsageRecorded event. */
export const USAGE_RECORDED_SUBJECT = "tollgate.usage.v1.recorded";
/** Base subject of UsageBatch: several usage events in one message. */
export const USAGE_BATCH_SUBJECT = "tollgate.usage.v1.batch";
/** Durable consumer name of the metering service (UsageRecorded). */
export const METERING_DURABLE = "metering";
/**
 * Durable consumer name of the metering service for UsageBatch: a consumer of its own, so a
 * metering replica that predates batches (on METERING_DURABLE) is never handed one.
 */
export const METERING_BATCH_DURABLE = "metering-batch";
/**
 * Core NATS subject on which key revocations are broadcast to every auth-policy replica, so
 * each drops the key from its cache at once.
 */
export const KEY_REVOKED_SUBJECT = "tollgate.auth.v1.key-revoked";
/** Core NATS subject on which an inference-router replica tells the others it cooled an upstream down. */
export const UPSTREAM_COOLDOWN_SUBJECT = "tollgate.inference.v1.upstream-cooldown";

/** The NATS names one deployment uses. */
export interface NatsNames {
  usageStream: string;
  usageSubjects: string;
  usageRecorded: string;
  usageBatch: string;
  meteringDurable: string;
  meteringBatchDurable: string;
  keyRevoked: string;
  upstreamCooldown: string;
}

/**
 * Names for a namespace. Deployments use the empty namespace; tests sharing one NATS server
 * pass a unique namespace so their streams, subjects and consumers never meet.
 */
export function natsNames(namespace = ""): NatsNames {
  const ns = namespace.replace(/[^A-Za-z0-9_-]/g, "_");
  const subject = (s: string) => (ns ? `${ns}.${s}` : s);
  return {
    usageStream: ns ? `${USAGE_STREAM}_${ns}` : USAGE_STREAM,
    usageSubjects: subject("tollgate.usage.v1.>"),
    usageRecorded: subject(USAGE_RECORDED_SUBJECT),
    usageBatch: subject(USAGE_BATCH_SUBJECT),
    meteringDurable: ns ? `${METERING_DURABLE}_${ns}` : METERING_DURABLE,
    meteringBatchDurable: ns ? `${METERING_BATCH_DURABLE}_${ns}` : METERING_BATCH_DURABLE,
    keyRevoked: subject(KEY_REVOKED_SUBJECT),
    upstreamCooldown: subject(UPSTREAM_COOLDOWN_SUBJECT),
  };
}

// NATS names, defined once (docs/architecture.md, "The bus").

/** Base JetStream stream holding every usage event. */
export const USAGE_STREAM = "TOLLGATE_USAGE";
/** Base subject of the UsageRecorded event. */
export const USAGE_RECORDED_SUBJECT = "tollgate.usage.v1.recorded";
/** Durable consumer name of the metering service. */
export const METERING_DURABLE = "metering";
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
  meteringDurable: string;
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
    meteringDurable: ns ? `${METERING_DURABLE}_${ns}` : METERING_DURABLE,
    keyRevoked: subject(KEY_REVOKED_SUBJECT),
    upstreamCooldown: subject(UPSTREAM_COOLDOWN_SUBJECT),
  };
}

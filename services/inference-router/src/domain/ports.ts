import type { AttemptFailure } from "./errors.js";

/** Token counts reported by an upstream (or counted by the router when it reports none). */
export interface TokenCounts {
  inputTokens: number;
  outputTokens: number;
  reasoningTokens: number;
}

/** One request as a provider sees it: an OpenAI-compatible JSON body aimed at one upstream model. */
export interface ProviderRequest {
  /** The upstream call: /chat/completions, /completions or /embeddings. */
  operation: "chat" | "text" | "embeddings";
  /** The JSON body to send, with the upstream model id and output cap already set. */
  body: Record<string, unknown>;
  /**
   * Time left before the request's deadline, in milliseconds: the attempt ends by then even when
   * the upstream's own total timeout is longer. Absent: the upstream's total timeout alone.
   */
  timeLeftMs?: number;
}

/** A buffered provider answer. */
export interface ProviderResult {
  /** OpenAI-compatible response JSON. */
  json: Record<string, unknown>;
  usage: TokenCounts | undefined;
  /** The upstream that served it, when the provider composes several; absent: the provider's id. */
  upstreamId?: string;
}

/** One streamed event: a chunk JSON, possibly carrying usage (the upstream's final usage chunk). */
export interface ProviderChunk {
  json: Record<string, unknown>;
  usage: TokenCounts | undefined;
  /** The upstream that serves the stream, when the provider composes several; absent: the provider's id. */
  upstreamId?: string;
}

/**
 * An upstream that runs completions (an adapter under src/adapters/ speaks its wire protocol; the
 * domain sees only this).
 */
export interface Provider {
  id: string;
  complete(req: ProviderRequest, signal: AbortSignal): Promise<ProviderResult>;
  stream(req: ProviderRequest, signal: AbortSignal): AsyncIterable<ProviderChunk>;
}

/** A usage event, as the domain knows it. */
export interface UsageEvent {
  eventId: string;
  occurredAt: Date;
  requestId: string;
  door: "account" | "paid";
  accountId: string;
  connectionId: string;
  keyId: string;
  model: string;
  runtime: string;
  upstreamId: string;
  tokens: TokenCounts;
  cost: bigint;
  pricingSnapshotId: string;
  reservationId: string;
  /** The paid door's payment channel holding `reservationId` (metering commits the hold with it). */
  channelId?: string;
  outcome: "completed" | "client_cancelled" | "upstream_failed";
  streamed: boolean;
  /** The upstream operation that served it. */
  operation: ProviderRequest["operation"];
}

/** Where usage events go (JetStream in deployments). Resolves once the event is stored durably. */
export interface UsagePublisher {
  publish(event: UsageEvent): Promise<void>;
}

/** A cooldown one router replica decided, as every replica learns it. */
export interface CooldownNotice {
  upstreamId: string;
  durationMs: number;
  reason: CooldownReason;
}

/** What an upstream is probed with: the route and upstream model id of the attempts that failed. */
export interface ProbeTarget {
  operation: ProviderRequest["operation"];
  /** The model id the upstream expects (as the failed attempts named it). */
  model: string;
}

/**
 * Asks an upstream whether it still answers a request of the gateway's own, whose content no
 * caller chose: a one-token completion of a fixed prompt, under the upstream's connect and
 * first-token timeouts. Its answer goes to no caller and is billed to nobody.
 */
export interface UpstreamProbe {
  /**
   * Undefined when the upstream answered 2xx; otherwise how the probe failed, as an attempt would.
   * Never rejects.
   */
  probe(upstreamId: string, target: ProbeTarget): Promise<AttemptFailure | undefined>;
}

/** Why an upstream was cooled down: repeated failures, or its own Retry-After. */
export type CooldownReason = "failures" | "retry_after";

/**
 * Shares cooldowns between router replicas (core NATS in deployments, memory in one process).
 * Fire and forget: a lost notice only means another replica finds out by itself.
 */
export interface CooldownBroadcast {
  publish(notice: CooldownNotice): void;
  /** Calls `handler` for every notice another replica publishes from now on; returns the unsubscribe. */
  subscribe(handler: (notice: CooldownNotice) => void): () => void;
}

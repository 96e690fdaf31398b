/** Token counts reported by an upstream (or counted by the router when it reports none). */
export interface TokenCounts {
  inputTokens: number;
  outputTokens: number;
  reasoningTokens: number;
}

/** One request as a provider sees it: an OpenAI-compatible JSON body aimed at one upstream model. */
export interface ProviderRequest {
  operation: "chat" | "text";
  /** The JSON body to send, with the upstream model id and output cap already set. */
  body: Record<string, unknown>;
}

/** A buffered provider answer. */
export interface ProviderResult {
  /** OpenAI-compatible response JSON. */
  json: Record<string, unknown>;
  usage: TokenCounts | undefined;
}

/** One streamed event: a chunk JSON, possibly carrying usage (the upstream's final usage chunk). */
export interface ProviderChunk {
  json: Record<string, unknown>;
  usage: TokenCounts | undefined;
}

/** An upstream that runs completions (STYLE.md, "Providers"). */
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
  outcome: "completed" | "client_cancelled" | "upstream_failed";
  streamed: boolean;
}

/** Where usage events go (JetStream in deployments). Resolves once the event is stored durably. */
export interface UsagePublisher {
  publish(event: UsageEvent): Promise<void>;
}

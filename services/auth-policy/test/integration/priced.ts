// The priced model the integration tests quote against, and the chat request they ask with.
import { Route } from "@tollgate/proto/auth";

/** One base unit per token: a quote is bodyBytes + 8 × messages + 16 + the output cap. */
export const PRICED_MODEL = {
  id: "priced",
  upstream: "u",
  upstreamModel: "c",
  runtime: "vllm",
  pricing: { inputPerMillion: 1_000_000, outputPerMillion: 1_000_000 },
} as const;

/** A chat request on PRICED_MODEL (the connection's default) quoted 200: 100 + 8 + 16 + 76. */
export function chatAsk(key: string) {
  return {
    key,
    route: Route.CHAT_COMPLETIONS,
    model: "",
    maxOutputTokens: 76,
    bodyBytes: 100,
    messageCount: 1,
  };
}

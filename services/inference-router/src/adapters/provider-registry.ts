import type { UpstreamConfig } from "@tollgate/config";
import type { Provider } from "../domain/ports.js";
import { createOpenAICompatibleProvider } from "./openai-compatible/provider.js";

/** A provider with its connections to close at shutdown. */
export type ClosableProvider = Provider & { close(): Promise<void> };

type Factory = (upstream: UpstreamConfig, apiKey: string | undefined) => ClosableProvider;

/** Provider kinds → factories. Adding a provider kind is one folder and one line here. */
const FACTORIES = {
  "openai-compatible": (u, apiKey) =>
    createOpenAICompatibleProvider({
      id: u.id,
      baseUrl: u.baseUrl,
      timeoutMs: u.timeoutMs,
      ...(apiKey ? { apiKey } : {}),
    }),
} satisfies Record<UpstreamConfig["kind"], Factory>;

/** Builds one provider per configured upstream. */
export function createProviders(
  upstreams: readonly UpstreamConfig[],
  keys: Readonly<Record<string, string>>,
): Map<string, ClosableProvider> {
  return new Map(upstreams.map((u) => [u.id, FACTORIES[u.kind](u, keys[u.id])]));
}

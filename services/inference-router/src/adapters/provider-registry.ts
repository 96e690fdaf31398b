import { type ResilienceConfig, type UpstreamConfig, upstreamPolicy } from "@tollgate/config";
import type { AttemptFailure } from "../domain/errors.js";
import type { ProbeTarget, Provider, UpstreamProbe } from "../domain/ports.js";
import { createAnthropicProvider } from "./anthropic/provider.js";
import { createOpenAICompatibleProvider } from "./openai-compatible/provider.js";

/** A provider with its probe (see UpstreamProbe) and its connections to close at shutdown. */
export type ClosableProvider = Provider & {
  probe(target: ProbeTarget): Promise<AttemptFailure | undefined>;
  close(): Promise<void>;
};

type Factory = (
  upstream: UpstreamConfig,
  resilience: ResilienceConfig,
  apiKey: string | undefined,
) => ClosableProvider;

/** What every provider kind is built with: the upstream's id, URL, timeouts and key. */
function settings(u: UpstreamConfig, resilience: ResilienceConfig, apiKey: string | undefined) {
  return {
    id: u.id,
    baseUrl: u.baseUrl,
    timeouts: upstreamPolicy(resilience, u).timeouts,
    ...(apiKey ? { apiKey } : {}),
  };
}

/** Provider kinds → factories. Adding a provider kind is one folder and one line here. */
const FACTORIES = {
  "openai-compatible": (...args) => createOpenAICompatibleProvider(settings(...args)),
  anthropic: (...args) => createAnthropicProvider(settings(...args)),
} satisfies Record<UpstreamConfig["kind"], Factory>;

/** Builds one provider per configured upstream: one attempt at that upstream per call. */
export function createProviders(
  upstreams: readonly UpstreamConfig[],
  resilience: ResilienceConfig,
  keys: Readonly<Record<string, string>>,
): Map<string, ClosableProvider> {
  return new Map(upstreams.map((u) => [u.id, FACTORIES[u.kind](u, resilience, keys[u.id])]));
}

/** The probe port over the providers' own probes; an upstream it does not know never answers. */
export function upstreamProbe(providers: ReadonlyMap<string, ClosableProvider>): UpstreamProbe {
  return {
    probe: async (upstreamId, target) => {
      const provider = providers.get(upstreamId);
      return provider ? provider.probe(target) : "connect_error";
    },
  };
}

import { type ModelConfig, type ModelKind, modelUpstreams, type Prices } from "@tollgate/config";
import { InferenceError } from "./errors.js";
import type { FailoverMember } from "./failover.js";
import type { Provider } from "./ports.js";

/** Where one public model id is served. */
export interface ModelRoute {
  model: string;
  upstreamModel: string;
  runtime: string;
  prices: Prices;
  /** Runs the model's completions; its answers name the upstream that served them. */
  provider: Provider;
  /** Whether the upstream returns reasoning content (configuration `reasoning`). */
  reasoning: boolean;
  /** What the model does (configuration `kind`): chat-shaped completions or embeddings. */
  kind: ModelKind;
}

/**
 * Puts a model's upstreams behind one provider (the failover provider in the router), which
 * sends each member its own `upstreamModel` when it names one.
 */
export type ComposeProviders = (model: string, members: FailoverMember[]) => Provider;

/** Without a composer, a model must have exactly one upstream with the model's own id. */
const single: ComposeProviders = (model, members) => {
  if (members.length !== 1 || members[0]!.upstreamModel)
    throw new Error(
      `model ${model}: several upstreams or an upstream's own model id need a failover composer`,
    );
  return members[0]!.provider;
};

/** Resolves public model ids to their upstreams, upstream model id, runtime and prices. */
export class Catalog {
  readonly #routes = new Map<string, ModelRoute>();

  constructor(
    models: readonly ModelConfig[],
    providers: ReadonlyMap<string, Provider>,
    compose: ComposeProviders = single,
  ) {
    for (const m of models) {
      const members = modelUpstreams(m).map((u) => {
        const provider = providers.get(u.id);
        if (!provider) throw new Error(`model ${m.id}: no provider for upstream ${u.id}`);
        return {
          provider,
          priority: u.priority,
          weight: u.weight,
          ...(u.upstreamModel ? { upstreamModel: u.upstreamModel } : {}),
        };
      });
      this.#routes.set(m.id, {
        model: m.id,
        upstreamModel: m.upstreamModel,
        runtime: m.runtime,
        prices: m.pricing,
        provider: compose(m.id, members),
        reasoning: m.reasoning,
        kind: m.kind,
      });
    }
  }

  /** The route of a public model id; model_not_found when the gateway does not serve it. */
  resolve(model: string): ModelRoute {
    const route = this.#routes.get(model);
    if (!route) throw new InferenceError("model_not_found", `the model '${model}' is not served here`);
    return route;
  }
}

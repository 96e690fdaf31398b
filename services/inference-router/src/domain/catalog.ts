import type { ModelConfig, Prices } from "@tollgate/config";
import { InferenceError } from "./errors.js";
import type { Provider } from "./ports.js";

/** Where one public model id is served. */
export interface ModelRoute {
  model: string;
  upstreamModel: string;
  runtime: string;
  prices: Prices;
  provider: Provider;
  /** Whether the upstream returns reasoning content (configuration `reasoning`). */
  reasoning: boolean;
}

/** Resolves public model ids to their upstream, upstream model id, runtime and prices. */
export class Catalog {
  readonly #routes = new Map<string, ModelRoute>();

  constructor(models: readonly ModelConfig[], providers: ReadonlyMap<string, Provider>) {
    for (const m of models) {
      const provider = providers.get(m.upstream);
      if (!provider) throw new Error(`model ${m.id}: no provider for upstream ${m.upstream}`);
      this.#routes.set(m.id, {
        model: m.id,
        upstreamModel: m.upstreamModel,
        runtime: m.runtime,
        prices: m.pricing,
        provider,
        reasoning: m.reasoning,
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

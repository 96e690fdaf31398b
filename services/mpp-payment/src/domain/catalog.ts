import {
  type GatewayConfig,
  inputBoundOf,
  MAX_OUTPUT_SEQUENCES,
  type ModelConfig,
  type PlanConfig,
  type PlanName,
  planNames,
  pricingSnapshotId,
  quoteOf,
} from "@tollgate/config";
import { PaymentError } from "./errors.js";

/** What an unpaid paid-door request asks for, after api-edge validated its body. */
export interface PaidRequest {
  httpMethod: string;
  path: string;
  plan: string;
  modelOptimization: boolean;
  /** Empty when model_optimization is true. */
  model: string;
  outputCap: number;
  messageCount: number;
  /** Output sequences asked of the upstream (`n`); 0 or absent: one. */
  outputSequences?: number;
  /** The exact request body bytes. */
  body: Uint8Array;
}

/** A request priced against the plan's model: what a challenge binds besides the digest. */
export interface PricedRequest {
  plan: PlanName;
  model: ModelConfig;
  pricingSnapshotId: string;
  /** Token bound of the input: every token is at least one body byte, plus template overhead. */
  inputCap: number;
  outputCap: number;
  /** Conservative cost: the input bound and the output cap at the model's prices. */
  quote: bigint;
}

/** Plans, models and prices of the paid door. */
export interface Catalog {
  /** Changes whenever any model's prices change. */
  readonly pricingSnapshotId: string;
  /**
   * Resolves the model (docs/contract.md, "The paid door": plan, model_optimization, model) and
   * prices the request.
   */
  price(req: PaidRequest): PricedRequest;
  /** True when `model` is still offered by `plan`. */
  offers(plan: string, model: string): boolean;
}

const UINT32_MAX = 0xffff_ffff;

function isPlanName(plan: string): plan is PlanName {
  return (planNames as readonly string[]).includes(plan);
}

/**
 * Builds the catalog; throws when the configuration has no plans (the paid door needs one at
 * least). A plan the configuration leaves out is refused as mpp_invalid_request.
 */
export function createCatalog(gateway: GatewayConfig): Catalog {
  const plans = gateway.plans;
  if (!plans)
    throw new Error(
      "the configuration defines no plans: the paid door needs at least one of Starter, Plus, Premium",
    );
  const models = new Map(gateway.models.map((m) => [m.id, m]));
  const snapshot = pricingSnapshotId(gateway.models);
  const planOf = (name: string): PlanConfig | undefined => (isPlanName(name) ? plans[name] : undefined);

  return {
    pricingSnapshotId: snapshot,

    offers(plan, model) {
      return planOf(plan)?.models.includes(model) ?? false;
    },

    price(req) {
      const invalid = (message: string) => new PaymentError("mpp_invalid_request", message);
      if (!isPlanName(req.plan)) throw invalid(`plan must be one of ${planNames.join(", ")}`);
      const plan = plans[req.plan];
      if (!plan) {
        const offered = planNames.filter((n) => plans[n] !== undefined);
        throw invalid(`plan ${req.plan} is not offered by this gateway; offered: ${offered.join(", ")}`);
      }
      let modelId: string;
      if (req.modelOptimization) {
        if (req.model !== "") throw invalid("model must be omitted when model_optimization is true");
        modelId = plan.default;
      } else {
        if (req.model === "") throw invalid("model is required when model_optimization is false");
        if (!plan.models.includes(req.model)) throw invalid("model is not available to the selected plan");
        modelId = req.model;
      }
      const model = models.get(modelId);
      if (!model) throw invalid("model is not available to the selected plan");
      if (!Number.isInteger(req.outputCap) || req.outputCap < 1) {
        throw invalid("an explicit output cap (max_tokens or max_completion_tokens) is required");
      }
      if (req.outputCap > model.maxOutputTokens) throw invalid("output cap is above the model's maximum");
      if (!Number.isInteger(req.messageCount) || req.messageCount < 1) throw invalid("messages are required");
      if (!req.httpMethod || !req.path.startsWith("/")) throw invalid("http method and path are required");
      const sequences = req.outputSequences || 1;
      if (!Number.isInteger(sequences) || sequences < 1 || sequences > MAX_OUTPUT_SEQUENCES)
        throw invalid(`n must be between 1 and ${MAX_OUTPUT_SEQUENCES}`);
      const inputCap = inputBoundOf(req.body.byteLength, req.messageCount);
      if (inputCap > UINT32_MAX) throw invalid("request body is too large");
      return {
        plan: req.plan,
        model,
        pricingSnapshotId: snapshot,
        inputCap,
        outputCap: req.outputCap,
        quote: quoteOf(req.body.byteLength, req.messageCount, req.outputCap, model.pricing, sequences),
      };
    },
  };
}

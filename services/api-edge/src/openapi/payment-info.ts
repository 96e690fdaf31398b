// The MPP discovery extension of the paid route's operation: `x-payment-info` (intent, method,
// amount, description), so that an agent reading /openapi.json knows how it will pay and what
// each plan's models cost before its first request. The 402 challenge stays authoritative.

import { type GatewayConfig, planNames } from "@tollgate/config";

/** The part of the gateway configuration the paid door's prices come from. */
export type PaidOffer = Pick<GatewayConfig, "plans" | "models">;

/** One model of a plan, priced as `GET /v1/models` shows prices (base units, decimal strings). */
export interface PlanModelInfo {
  id: string;
  input_per_million: string;
  output_per_million: string;
  currency_decimals: 6;
  max_output_tokens: number;
}

export interface PlanInfo {
  name: string;
  /** The model `model_optimization: true` runs. */
  default_model: string;
  models: PlanModelInfo[];
}

export interface PaymentInfo {
  intent: "session";
  method: "tempo";
  /** Null: the price depends on the request (its input bound and output cap), quoted per request. */
  amount: null;
  description: string;
  plans: PlanInfo[];
}

const DESCRIPTION =
  "Paid per request from an MPP session on Tempo. Each request's quote is its input bound times the " +
  "model's input price plus its output cap, once for every output sequence it asks for (the larger " +
  "of `n` and `best_of`), times " +
  "the output price (per million tokens, base units of " +
  "the payment token, 6 decimals); the 402 challenge carries it, and the committed cost, never above " +
  "it, is the tokens used at those prices (docs/money.md).";

/** `x-payment-info` of the paid route: every offered plan in plan order, each model with its prices. */
export function paymentInfo(offer: PaidOffer | undefined): PaymentInfo {
  const models = new Map((offer?.models ?? []).map((m) => [m.id, m]));
  const plans: PlanInfo[] = [];
  for (const name of planNames) {
    const plan = offer?.plans?.[name];
    if (!plan) continue;
    plans.push({
      name,
      default_model: plan.default,
      models: plan.models.flatMap((id) => {
        const m = models.get(id);
        if (!m) return [];
        return [
          {
            id,
            input_per_million: m.pricing.inputPerMillion.toString(),
            output_per_million: m.pricing.outputPerMillion.toString(),
            currency_decimals: 6 as const,
            max_output_tokens: m.maxOutputTokens,
          },
        ];
      }),
    });
  }
  return { intent: "session", method: "tempo", amount: null, description: DESCRIPTION, plans };
}

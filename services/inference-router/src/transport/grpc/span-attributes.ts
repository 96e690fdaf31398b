import { ATTR, type Attributes, genAiOperation } from "@tollgate/kit/tracing";
import type { CompletionInput, UsageSummary } from "../../domain/inference.js";

/** What the request asks for: operation, public model, output cap, door. Never its body. */
export function requestAttributes(input: CompletionInput): Attributes {
  return {
    [ATTR.genAiOperation]: genAiOperation(input.operation),
    [ATTR.genAiRequestModel]: input.model,
    ...(input.maxOutputTokens !== undefined ? { [ATTR.genAiMaxTokens]: input.maxOutputTokens } : {}),
    [ATTR.door]: input.billing.door,
  };
}

/** The answering model and the token counts recorded for the request. */
export function usageAttributes(usage: UsageSummary, model: unknown): Attributes {
  return {
    ...(typeof model === "string" ? { [ATTR.genAiResponseModel]: model } : {}),
    [ATTR.genAiInputTokens]: usage.inputTokens,
    [ATTR.genAiOutputTokens]: usage.outputTokens,
  };
}

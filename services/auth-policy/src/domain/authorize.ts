import { type Prices, quoteOf } from "@tollgate/config";
import {
  type BudgetCheck,
  type BudgetCount,
  budgetChecks,
  fits,
  newReservationId,
  remainingOf,
} from "./budget.js";
import { AuthError } from "./errors.js";
import { hashKey, keyState, lineageOf, sameHash, validUntil } from "./keys.js";
import type { HoldRequest, KeyRecord, KeyStore, Ledger, RateWindow, RouteName } from "./ports.js";
import { assertFitsAtAll, type RateLimitStatus, settle, windowsFor } from "./rate-limit.js";

/** What the caller asks for. */
export interface AuthorizeInput {
  key: string;
  /**
   * The route called; undefined when the caller did not say (then only an unrestricted connection
   * admits it).
   */
  route?: RouteName;
  /** Empty means the connection's default model. */
  model: string;
  maxOutputTokens?: number;
  /** Estimated input tokens, counted with the output cap against tokens-per-minute limits. */
  estimatedInputTokens?: number;
  /** UTF-8 length of the request body; undefined: 4 × estimatedInputTokens. */
  bodyBytes?: number;
  /** Messages (or prompts) in the body; undefined: bodyBytes (a message takes at least a byte). */
  messageCount?: number;
  /** Output sequences asked of the upstream (`n`/`best_of` × prompts); each is bounded by the cap. */
  outputSequences?: number;
  /**
   * Check the key and the route only, and take nothing (no rate-limit unit, no hold): for a
   * request refused for its body, whose refusal must cost nothing.
   */
  checkOnly?: boolean;
  /** The route needs a model that reasons (POST /v1/think). */
  requireReasoning?: boolean;
}

/** What the caller may do. */
export interface Authorization {
  accountId: string;
  connectionId: string;
  keyId: string;
  model: string;
  maxOutputTokens?: number;
  allowedModels: readonly string[];
  defaultModel: string;
  /** The rate-limit window closest to exhaustion after this request; undefined without limits. */
  rateLimit?: RateLimitStatus;
  /** When the key stops working unless revoked: expiry or end of rotation grace. */
  keyValidUntil?: Date;
  /** The request's quote (a sound upper bound of its cost); undefined for the models route. */
  quote?: bigint;
  /** The reservation holding the quote; undefined when no budget applies (or the models route). */
  reservationId?: string;
  /** The connection's budget left in its period after this request's hold; undefined: no budget. */
  budgetRemaining?: bigint;
  /** The same for the key's own budget. */
  keyBudgetRemaining?: bigint;
}

/** What authorize() reads and counts. */
export interface AuthorizeDeps {
  store: KeyStore;
  ledger: Ledger;
  /** Prices of every public model, for the quote. */
  prices: ReadonlyMap<string, Prices>;
  /** The public models whose configuration says they reason; absent: every model may. */
  reasoningModels?: ReadonlySet<string>;
  /**
   * The public models configured `kind: embedding`: they serve the embeddings route only, and
   * that route serves them only. Absent: no model is checked (inference-router still refuses).
   */
  embeddingModels?: ReadonlySet<string>;
}

/** Longest key accepted before hashing; anything larger is not one of ours. */
const MAX_KEY_LENGTH = 256;

const INVALID = "the Virtual Key is not valid";

const KEY_ENDED = {
  revoked: ["revoked_api_key", "the Virtual Key has been revoked"],
  expired: ["expired_api_key", "the Virtual Key has expired"],
  rotated: [
    "rotated_api_key",
    "the Virtual Key was rotated and its grace period has ended; use its replacement",
  ],
} as const;

/**
 * Resolves a Virtual Key and applies its connection's policy, in the order the error table
 * implies (docs/contract.md, "Authentication" and "Errors"): 401 for a missing, invalid, expired,
 * revoked or rotated-out key; 403 for a route, model or output cap outside policy; 429 when a
 * rate limit is reached; 402 when the request's quote does not fit a budget. Everything is
 * decided before any model runs; the rate-limit units and the budget hold of an admitted
 * request are taken in one atomic step, and a request refused for any reason takes neither.
 */
export async function authorize(
  deps: AuthorizeDeps,
  input: AuthorizeInput,
  now = new Date(),
): Promise<Authorization> {
  const checked = await checkPolicy(deps, input, now);
  if (checked.checkOnly) return checked.base;
  const { base, model, cap, windows, quote, checks, record } = checked;
  let hold: HoldRequest | undefined;
  if (checks.length > 0 && cap !== undefined) {
    // Every configured model has prices (the configuration requires them).
    if (quote === undefined) throw new Error(`model '${model}' has no prices; cannot check its budget`);
    hold = { reservationId: newReservationId(record.accountId), amount: quote, budgets: checks };
  }

  let rateLimit: RateLimitStatus | undefined;
  let counts: BudgetCount[] = [];
  if (windows.length > 0 || checks.length > 0) {
    const budgets = hold ? { hold } : checks.length > 0 ? { peek: checks } : undefined;
    const decision = await deps.ledger.admit(windows, budgets, now);
    // A rate limit is reported before a budget: waiting may cure it, and it is checked first.
    if (!decision.rateAdmitted) settle(windows, { ...decision, admitted: false });
    if (!decision.budgetsAdmitted) throw budgetExceeded(checks, decision.budgets, quote ?? 0n, now);
    if (windows.length > 0) rateLimit = settle(windows, { ...decision, admitted: true });
    counts = decision.budgets;
  }
  return {
    ...base,
    model,
    ...(cap !== undefined ? { maxOutputTokens: cap } : {}),
    ...(rateLimit ? { rateLimit } : {}),
    ...(quote !== undefined ? { quote } : {}),
    ...(hold ? { reservationId: hold.reservationId } : {}),
    ...budgetsLeft(checks, counts, hold?.amount ?? 0n),
  };
}

/** The budgets left once `held` more is held: the connection's and the key's, where they apply. */
export function budgetsLeft(
  checks: readonly BudgetCheck[],
  counts: readonly BudgetCount[],
  held: bigint,
): Pick<Authorization, "budgetRemaining" | "keyBudgetRemaining"> {
  const left = (scope: BudgetCheck["scope"]) => {
    const i = checks.findIndex((c) => c.scope === scope);
    const count = counts[i];
    return i < 0 || !count ? undefined : remainingOf(checks[i]!, count, held);
  };
  const budgetRemaining = left("connection");
  const keyBudgetRemaining = left("key");
  return {
    ...(budgetRemaining !== undefined ? { budgetRemaining } : {}),
    ...(keyBudgetRemaining !== undefined ? { keyBudgetRemaining } : {}),
  };
}

/** A request that passed its key and policy checks: what admitting it takes. */
export type Checked =
  | { checkOnly: true; base: Authorization }
  | {
      checkOnly: false;
      base: Omit<Authorization, "model">;
      record: KeyRecord;
      /** The model that serves it; "" for the models route. */
      model: string;
      /** Its effective output cap; undefined for the models route. */
      cap?: number;
      /** Its rate-limit windows, each counting this request's units. */
      windows: RateWindow[];
      /** Its quote; undefined for the models route. */
      quote?: bigint;
      /** The budgets it must fit. */
      checks: BudgetCheck[];
    };

/**
 * The checks of authorize() that read no counter: the key, then the route, model, reasoning,
 * kind and output cap against the connection's policy, and a request too large for a window
 * at all. Throws the refusal authorize() would; takes nothing.
 */
export async function checkPolicy(deps: AuthorizeDeps, input: AuthorizeInput, now: Date): Promise<Checked> {
  if (input.key === "") throw new AuthError("missing_api_key", "no Virtual Key was sent");
  if (input.key.length > MAX_KEY_LENGTH) throw new AuthError("invalid_api_key", INVALID);
  const hash = hashKey(input.key);
  const record = await deps.store.findByHash(hash);
  if (!record || !sameHash(record.hash, hash)) throw new AuthError("invalid_api_key", INVALID);
  const state = keyState(record, now);
  if (state === "revoked" || state === "expired" || state === "rotated") {
    const [code, message] = KEY_ENDED[state];
    throw new AuthError(code, message);
  }
  const found = await deps.store.policy(record.accountId, record.connectionId);
  if (!found) throw new AuthError("invalid_api_key", INVALID);
  const { connection: policy, account } = found;

  if (policy.routes && !(input.route && policy.routes.includes(input.route))) {
    throw new AuthError(
      "route_not_allowed",
      input.route
        ? `the route '${input.route}' is not available to this key`
        : "the route is not available to this key",
    );
  }

  const until = validUntil(record);
  const base = {
    accountId: record.accountId,
    connectionId: record.connectionId,
    keyId: record.keyId,
    allowedModels: policy.models,
    defaultModel: policy.defaultModel,
    ...(until ? { keyValidUntil: until } : {}),
  };
  if (input.checkOnly) return { checkOnly: true, base: { ...base, model: "" } };
  let model = "";
  let cap: number | undefined;
  if (input.route !== "models") {
    model = input.model === "" ? policy.defaultModel : input.model;
    if (!policy.models.includes(model)) {
      throw new AuthError("model_not_allowed", `the model '${model}' is not available to this key`);
    }
    if (input.requireReasoning && deps.reasoningModels && !deps.reasoningModels.has(model)) {
      throw new AuthError(
        "model_cannot_reason",
        `the model '${model}' cannot reason; choose a model with reasoning for this route`,
      );
    }
    if (deps.embeddingModels && input.route) {
      const embedding = deps.embeddingModels.has(model);
      if (embedding !== (input.route === "embeddings")) {
        throw new AuthError(
          "model_kind_mismatch",
          embedding
            ? `the model '${model}' is an embedding model; use it with POST /v1/embeddings`
            : `the model '${model}' is not an embedding model; choose one for POST /v1/embeddings`,
        );
      }
    }
    cap = input.maxOutputTokens ?? policy.defaultMaxOutputTokens;
    if (cap > policy.maxOutputTokens) {
      throw new AuthError(
        "output_cap_above_policy",
        `the output cap ${cap} is above this connection's maximum of ${policy.maxOutputTokens}`,
      );
    }
  }

  const sequences = Math.max(1, input.outputSequences ?? 1);
  const tokens = cap === undefined ? 0 : cap * sequences + (input.estimatedInputTokens ?? 0);
  const windows = windowsFor({
    connection: policy,
    keyLineageId: lineageOf(record),
    tokens,
    ...(account ? { account } : {}),
    ...(input.route ? { route: input.route } : {}),
  });
  if (windows.length > 0) assertFitsAtAll(windows);

  let quote: bigint | undefined;
  if (cap !== undefined) {
    const prices = deps.prices.get(model);
    if (prices) {
      const bodyBytes = input.bodyBytes ?? (input.estimatedInputTokens ?? 0) * 4;
      quote = quoteOf(bodyBytes, input.messageCount ?? bodyBytes, cap, prices, sequences);
    }
  }
  const checks = budgetChecks({
    accountId: record.accountId,
    connectionId: record.connectionId,
    keyLineageId: lineageOf(record),
    connectionBudget: policy.budget,
    keyBudget: record.budget,
    now,
  });
  return {
    checkOnly: false,
    base,
    record,
    model,
    ...(cap !== undefined ? { cap } : {}),
    windows,
    ...(quote !== undefined ? { quote } : {}),
    checks,
  };
}

/** The refusal of a request whose quote does not fit: the budget with the least left is named. */
function budgetExceeded(
  checks: readonly BudgetCheck[],
  counts: readonly BudgetCount[],
  quote: bigint,
  now: Date,
): AuthError {
  let worst: { check: BudgetCheck; remaining: bigint } | undefined;
  checks.forEach((check, i) => {
    const count = counts[i] ?? { spent: 0n, held: 0n };
    if (fits(check, count, quote)) return;
    const remaining = remainingOf(check, count, 0n);
    if (!worst || remaining < worst.remaining) worst = { check, remaining };
  });
  const { check, remaining } = worst ?? { check: checks[0]!, remaining: 0n };
  const resetSeconds = Math.max(1, Math.ceil((check.periodEndMs - now.getTime()) / 1_000));
  return new AuthError(
    "budget_exceeded",
    `the request's quote of ${quote} base units does not fit the ${check.scope} budget: ${remaining} of ${check.limit} left in this period; send a smaller request (lower max_tokens) or raise the budget`,
    undefined,
    { scope: check.scope, limit: check.limit, remaining, quote, resetSeconds },
  );
}

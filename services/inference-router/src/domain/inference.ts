import { costOf, PAID_DOOR_FIELDS, takeOutputCaps } from "@tollgate/config";
import type { Catalog, ModelRoute } from "./catalog.js";
import { InferenceError } from "./errors.js";
import type { ProviderRequest, TokenCounts, UsageEvent, UsagePublisher } from "./ports.js";

/** Whom a request is billed to. */
export interface Billing {
  door: "account" | "paid";
  accountId: string;
  connectionId: string;
  keyId: string;
  reservationId: string;
  /** The request's quote in base units: what is charged never exceeds it. Undefined: no cap. */
  quote?: bigint;
  /** The paid door's payment channel holding `reservationId`, carried into the usage event. */
  channelId?: string;
}

/** One authorized completion. */
export interface CompletionInput {
  requestId: string;
  operation: "chat" | "text" | "embeddings";
  model: string;
  maxOutputTokens?: number;
  /** The caller's OpenAI-compatible JSON body. */
  body: Record<string, unknown>;
  /** The caller's route needs reasoning (POST /v1/think): refuse a model that cannot reason. */
  requireReasoning?: boolean;
  billing: Billing;
}

/** Usage as reported back to the caller and recorded. */
export interface UsageSummary extends TokenCounts {
  cost: bigint;
  pricingSnapshotId: string;
  /** The recorded usage event's id. */
  eventId: string;
}

/** A request whose usage priced above its quote: the upstream produced more than was asked. */
export interface OverQuote {
  requestId: string;
  model: string;
  door: Billing["door"];
  upstreamId: string;
  /** The cost of the tokens the upstream reported. */
  uncapped: bigint;
  /** What was charged: the quote. */
  quote: bigint;
}

/**
 * What a stream yields: chunk JSON for the caller, each with the usage event the stream is
 * billed with if it ends right after that chunk (`soFar`, under the stream's one event id, for
 * whoever relays the stream to record should the router be lost), then the usage last.
 */
export type StreamEvent = { chunk: Record<string, unknown>; soFar: UsageEvent } | { usage: UsageSummary };

/**
 * Runs completions against the catalog's upstreams, counts their usage (also for streams cut
 * short), prices it with the pricing snapshot and publishes one usage event per served request.
 */
export class Inference {
  constructor(
    private readonly catalog: Catalog,
    private readonly publisher: UsagePublisher,
    private readonly pricingSnapshotId: string,
    private readonly newEventId: () => string,
    /** Told of every recorded request charged its quote instead of its (higher) token cost. */
    private readonly onOverQuote: (over: OverQuote) => void = () => {},
  ) {}

  /** A buffered completion. */
  async complete(
    input: CompletionInput,
    signal: AbortSignal,
  ): Promise<{ json: Record<string, unknown>; usage: UsageSummary }> {
    const route = this.#resolve(input);
    let result: Awaited<ReturnType<typeof route.provider.complete>>;
    try {
      result = await route.provider.complete(this.#request(input, route, false), signal);
    } catch (err) {
      // The caller went away before the answer: nothing reached it, and it is recorded all the
      // same at zero, as a stream cut before its first chunk is, so metering settles the request's
      // hold (a lease ticket api-edge left unsure) instead of it waiting out the reservation TTL
      // (docs/money.md, "Holds"). A publish that fails leaves it to the TTL, as before.
      if (signal.aborted) {
        await this.#record(input, route, route.provider.id, NOTHING, "client_cancelled", false).catch(
          () => {},
        );
      }
      throw err;
    }
    if (input.operation === "embeddings" && !embeddingsIn(result.json)) {
      // Not billed: nothing usable came back.
      throw new InferenceError("upstream_error", "the upstream sent no readable embeddings");
    }
    result.json.model = route.model;
    let tokens = result.usage ?? estimate(input.body, outputTextLength(result.json));
    // An embedding produces no tokens: only its input is counted and priced.
    if (input.operation === "embeddings") tokens = { ...tokens, outputTokens: 0, reasoningTokens: 0 };
    else if (result.usage === undefined) result.json.usage = toldUsage(result.json.usage, tokens);
    const servedBy = result.upstreamId ?? route.provider.id;
    const usage = await this.#record(input, route, servedBy, tokens, "completed", false);
    const json =
      input.operation === "embeddings" ? embeddingsAnswer(result.json, route.model, usage) : result.json;
    return { json, usage };
  }

  /**
   * A streamed completion. The upstream is always asked for usage; the usage chunk reaches the
   * caller only when it asked for it. When the caller goes away (the consumer stops iterating)
   * or the upstream fails mid-stream, the tokens produced so far are recorded.
   */
  async *stream(
    input: CompletionInput,
    includeUsage: boolean,
    signal: AbortSignal,
  ): AsyncGenerator<StreamEvent> {
    if (input.operation === "embeddings") {
      throw new InferenceError("invalid_request", "embeddings are not streamed");
    }
    const route = this.#resolve(input);
    // One event id for the stream, whoever ends up publishing its usage (see StreamEvent).
    const eventId = this.newEventId();
    const tally = new StreamTally(input.body);
    const tokens = () => tally.tokens();
    // The usage so far of the last chunk, reused while the count and the upstream stay the same.
    let soFar: UsageEvent | undefined;
    let started = false;
    // The upstream that served the stream (failed attempts before it are not billed).
    let servedBy = route.provider.id;
    let outcome: UsageEvent["outcome"] | undefined;
    try {
      for await (const chunk of route.provider.stream(this.#request(input, route, true), signal)) {
        started = true;
        if (chunk.upstreamId) servedBy = chunk.upstreamId;
        tally.see(chunk.json, chunk.usage);
        const choices = chunk.json.choices;
        const usageOnly = Array.isArray(choices) && choices.length === 0;
        // Usage rides on content chunks only when the upstream counts continuously (asked by
        // the router, see #request); the caller gets usage in the usage chunk alone.
        if (!usageOnly) delete chunk.json.usage;
        else if (!includeUsage) continue;
        chunk.json.model = route.model;
        const counted = tokens();
        if (usageOnly && chunk.usage === undefined) chunk.json.usage = toldUsage(chunk.json.usage, counted);
        if (soFar?.tokens !== counted || soFar.upstreamId !== servedBy) {
          soFar = this.#event(input, route, servedBy, counted, "upstream_failed", true, eventId);
        }
        yield { chunk: chunk.json, soFar };
      }
      outcome = "completed";
    } catch (err) {
      outcome = signal.aborted ? "client_cancelled" : "upstream_failed";
      if (outcome === "upstream_failed") throw err;
    } finally {
      // The consumer stopping early (the caller went away) also lands here, with no outcome.
      outcome ??= "client_cancelled";
      if (outcome === "upstream_failed") {
        // Billed exactly the usage so far sent with the last chunk relayed: the figure the relay
        // records under the same event id if this router is lost, and tells its caller with the
        // stream's error (docs/money.md, "Records"). Nothing relayed: nothing billed, and the
        // relay gives the hold back.
        if (soFar) await this.#record(input, route, soFar.upstreamId, soFar.tokens, outcome, true, eventId);
      } else if (outcome !== "completed") {
        // The caller went away: billed what was produced. Before the upstream's first chunk that
        // is nothing, recorded all the same at zero, so metering settles the request's hold (a
        // lease ticket api-edge left unsure) instead of it waiting out the reservation TTL
        // (docs/money.md, "Holds").
        await this.#record(input, route, servedBy, started ? tokens() : NOTHING, outcome, true, eventId);
      }
    }
    if (outcome !== "completed") return;
    yield { usage: await this.#record(input, route, servedBy, tokens(), "completed", true, eventId) };
  }

  /**
   * The model's route; a model of the wrong kind for the operation (an embedding model asked for
   * a completion, a chat model for embeddings), or one that cannot reason asked to, is refused
   * before any upstream call.
   */
  #resolve(input: CompletionInput): ModelRoute {
    const route = this.catalog.resolve(input.model);
    const kind = input.operation === "embeddings" ? "embedding" : "chat";
    if (route.kind !== kind) {
      throw new InferenceError(
        "model_kind_mismatch",
        kind === "embedding"
          ? `the model '${route.model}' is not an embedding model; choose one for POST /v1/embeddings`
          : `the model '${route.model}' is an embedding model; use it with POST /v1/embeddings`,
      );
    }
    if (input.requireReasoning && !route.reasoning) {
      throw new InferenceError(
        "model_cannot_reason",
        `the model '${route.model}' cannot reason; choose a model with reasoning for this route`,
      );
    }
    return route;
  }

  /**
   * The upstream's body: the caller's, with the upstream model id, exactly one output cap (the
   * gateway's: the smallest of the authorized cap and every cap alias the caller sent, inference
   * servers' own length fields included; the aliases themselves are removed), without the paid
   * door's own fields, and, for a stream, usage asked for. A vLLM upstream is also asked for
   * continuous usage, so a stream cut short is billed its exact input tokens.
   */
  #request(input: CompletionInput, route: ModelRoute, stream: boolean): ProviderRequest {
    const body: Record<string, unknown> = { ...input.body, model: route.upstreamModel };
    if (input.billing.door === "paid") for (const f of PAID_DOOR_FIELDS) delete body[f];
    const bodyCap = takeOutputCaps(body);
    if (input.operation === "embeddings") {
      // No output to cap; an embedding is never streamed.
      delete body.stream;
      delete body.stream_options;
      return { operation: input.operation, body };
    }
    const caps = [bodyCap, input.maxOutputTokens].filter((c): c is number => c !== undefined);
    if (caps.length > 0) {
      const onlyNewName = "max_completion_tokens" in input.body && !("max_tokens" in input.body);
      body[input.operation === "chat" && onlyNewName ? "max_completion_tokens" : "max_tokens"] = Math.min(
        ...caps,
      );
    }
    if (stream) {
      body.stream = true;
      const options =
        typeof body.stream_options === "object" && body.stream_options !== null ? body.stream_options : {};
      body.stream_options = {
        ...options,
        include_usage: true,
        ...(route.runtime === "vllm" ? { continuous_usage_stats: true } : {}),
      };
    } else {
      delete body.stream;
      delete body.stream_options;
    }
    return { operation: input.operation, body };
  }

  #event(
    input: CompletionInput,
    route: ModelRoute,
    upstreamId: string,
    tokens: TokenCounts,
    outcome: UsageEvent["outcome"],
    streamed: boolean,
    eventId: string,
  ): UsageEvent {
    return {
      eventId,
      occurredAt: new Date(),
      requestId: input.requestId,
      ...input.billing,
      model: route.model,
      runtime: route.runtime,
      upstreamId,
      tokens,
      cost: chargeOf(input.billing, costOf(tokens, route.prices)),
      pricingSnapshotId: this.pricingSnapshotId,
      outcome,
      streamed,
      operation: input.operation,
    };
  }

  async #record(
    input: CompletionInput,
    route: ModelRoute,
    upstreamId: string,
    tokens: TokenCounts,
    outcome: UsageEvent["outcome"],
    streamed: boolean,
    eventId = this.newEventId(),
  ): Promise<UsageSummary> {
    const event = this.#event(input, route, upstreamId, tokens, outcome, streamed, eventId);
    const cost = event.cost;
    const uncapped = costOf(tokens, route.prices);
    if (uncapped > cost) {
      this.onOverQuote({
        requestId: input.requestId,
        model: route.model,
        door: input.billing.door,
        upstreamId,
        uncapped,
        quote: cost,
      });
    }
    try {
      await this.publisher.publish(event);
    } catch {
      // The publisher has logged the event given up, with its event and request ids
      // (services/inference-router/src/adapters/bus-usage-publisher.ts).
      throw new InferenceError("usage_not_recorded", "the usage of this request could not be recorded");
    }
    return { ...tokens, cost, pricingSnapshotId: this.pricingSnapshotId, eventId };
  }
}

/** The usage of a stream cut before its upstream sent anything: nothing was produced. */
const NOTHING: TokenCounts = { inputTokens: 0, outputTokens: 0, reasoningTokens: 0 };

/** What a request is charged: its token cost, never more than its quote (docs/money.md). */
function chargeOf(billing: Billing, cost: bigint): bigint {
  return billing.quote !== undefined && cost > billing.quote ? billing.quote : cost;
}

/**
 * Counts a stream's tokens as it goes: the upstream's own totals once its usage chunk came;
 * before that, its continuous per-choice counts (vLLM reports each choice's tokens so far on
 * that choice's chunks), summed over the choices; without any, an estimate.
 */
class StreamTally {
  #final: TokenCounts | undefined;
  readonly #perChoice = new Map<number, TokenCounts>();
  #chunks = 0;
  /** The prompt's estimated input tokens, read from the body once (not at every chunk). */
  readonly #inputEstimate: number;
  /** Prompts in the body: each choice of a prompt list reports its own prompt's tokens. */
  readonly #prompts: number;
  /** The count last returned, until a chunk changes it: the same object while it holds. */
  #counted: TokenCounts | undefined;

  constructor(body: Record<string, unknown>) {
    this.#inputEstimate = estimate(body, 0).inputTokens;
    this.#prompts = Array.isArray(body.prompt) ? body.prompt.length : 1;
  }

  see(json: Record<string, unknown>, usage: TokenCounts | undefined): void {
    const choices = json.choices;
    if (Array.isArray(choices) && choices.length === 0) {
      if (usage) {
        this.#final = usage;
        this.#counted = undefined;
      }
      return;
    }
    if (countsAsToken(json)) {
      this.#chunks++;
      this.#counted = undefined;
    }
    if (!usage) return;
    const first = Array.isArray(choices) ? (choices[0] as { index?: unknown } | undefined) : undefined;
    this.#perChoice.set(typeof first?.index === "number" ? first.index : 0, usage);
    this.#counted = undefined;
  }

  tokens(): TokenCounts {
    this.#counted ??= this.#count();
    return this.#counted;
  }

  #count(): TokenCounts {
    if (this.#final) return this.#final;
    const estimated = { inputTokens: this.#inputEstimate, outputTokens: this.#chunks, reasoningTokens: 0 };
    if (this.#perChoice.size === 0) return estimated;
    let input = 0;
    let output = 0;
    let reasoning = 0;
    for (const u of this.#perChoice.values()) {
      // Every choice of one prompt reports that prompt's tokens.
      input = Math.max(input, u.inputTokens);
      output += u.outputTokens;
      reasoning += u.reasoningTokens;
    }
    // A prompt list's choices report their own prompt's tokens: the estimate covers them all.
    return {
      inputTokens: this.#prompts > 1 ? Math.max(input, estimated.inputTokens) : input,
      outputTokens: Math.max(output, this.#chunks),
      reasoningTokens: reasoning,
    };
  }
}

/**
 * The caller's embeddings answer, as OpenAI shapes it: the upstream's vectors in input order (by
 * each item's `index` when it gives one), the public model id, and the billed input tokens as
 * usage, so the answer and the charge always agree.
 */
function embeddingsAnswer(
  json: Record<string, unknown>,
  model: string,
  usage: TokenCounts,
): Record<string, unknown> {
  const items = (json.data as Array<{ embedding: unknown; index?: unknown }>).map((item, i) => ({
    embedding: item.embedding,
    at: typeof item.index === "number" ? item.index : i,
  }));
  items.sort((a, b) => a.at - b.at);
  return {
    object: "list",
    data: items.map((item, index) => ({ object: "embedding", index, embedding: item.embedding })),
    model,
    usage: { prompt_tokens: usage.inputTokens, total_tokens: usage.inputTokens },
  };
}

/** Whether an embeddings answer carries its vectors: a list of numbers or a base64 string each. */
function embeddingsIn(json: Record<string, unknown>): boolean {
  return (
    Array.isArray(json.data) &&
    json.data.every((item: unknown) => {
      const v = (item as { embedding?: unknown } | null)?.embedding;
      return typeof v === "string" || (Array.isArray(v) && v.every((x) => typeof x === "number"));
    })
  );
}

/** Whether a chunk carries generated text (one token per such chunk, for the fallback count). */
function countsAsToken(json: Record<string, unknown>): boolean {
  const choice = (json.choices as Array<Record<string, unknown>> | undefined)?.[0];
  if (!choice) return false;
  const delta = (choice.delta ?? {}) as Record<string, unknown>;
  return Boolean(delta.content || delta.reasoning_content || choice.text);
}

function outputTextLength(json: Record<string, unknown>): number {
  const choice = (json.choices as Array<Record<string, unknown>> | undefined)?.[0];
  const message = choice?.message as { content?: unknown } | undefined;
  const text =
    typeof message?.content === "string"
      ? message.content
      : typeof choice?.text === "string"
        ? choice.text
        : "";
  return Buffer.byteLength(text);
}

/**
 * The usage an answer tells its caller when the upstream sent no count (none, or one that is no
 * count: negative, fractional, a string): the estimate it is billed on, in OpenAI's usage shape,
 * so the body never disagrees with its `x-tollgate-cost` (docs/spend.md, "Without a count from
 * the upstream"). The upstream's other usage fields stay as they came.
 */
function toldUsage(raw: unknown, tokens: TokenCounts): Record<string, unknown> {
  const rest =
    typeof raw === "object" && raw !== null && !Array.isArray(raw) ? (raw as Record<string, unknown>) : {};
  return {
    ...rest,
    prompt_tokens: tokens.inputTokens,
    completion_tokens: tokens.outputTokens,
    total_tokens: tokens.inputTokens + tokens.outputTokens,
  };
}

/**
 * The fallback when an upstream reports no usage: about four bytes per token of the prompt text
 * (message contents or prompts; the JSON around them is not input), and either one token per
 * streamed chunk or four bytes per token of output text. What is charged stays within the
 * quote whatever the estimate (chargeOf).
 */
function estimate(body: Record<string, unknown>, outputBytes: number, outputChunks = 0): TokenCounts {
  return {
    inputTokens: Math.ceil(promptTextBytes(body) / 4),
    outputTokens: Math.max(outputChunks, Math.ceil(outputBytes / 4)),
    reasoningTokens: 0,
  };
}

/** UTF-8 bytes of the prompt text of a chat or text-completion body. */
function promptTextBytes(body: Record<string, unknown>): number {
  let bytes = 0;
  const text = (v: unknown) => {
    if (typeof v === "string") bytes += Buffer.byteLength(v);
    else if (Array.isArray(v))
      for (const part of v) text(typeof part === "object" && part ? part.text : part);
  };
  if (Array.isArray(body.messages)) {
    for (const m of body.messages) if (typeof m === "object" && m) text((m as { content?: unknown }).content);
  }
  text(body.prompt);
  // An embeddings request's input: a string, strings, or token ids (a token each).
  const input = body.input;
  if (typeof input === "string") text(input);
  else if (Array.isArray(input)) {
    for (const item of input) {
      if (typeof item === "string") text(item);
      else if (typeof item === "number") bytes += 4;
      else if (Array.isArray(item)) bytes += 4 * item.length;
    }
  }
  return bytes;
}

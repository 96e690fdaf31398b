import type { ServerResponse } from "node:http";
import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import type { StreamCompleteResponse, Usage } from "@tollgate/proto/inference";
import type { UsageRecorded } from "@tollgate/proto/usage";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { NamedEvent, StreamTranslation } from "../domain/stream-chunk.js";
import { errorBody, type HttpError, toHttpError } from "./errors.js";

/** One Server-Sent Event: its `data:` payload, and its `event:` name when the wire format names events. */
export interface SseEvent {
  event?: string;
  data: string;
}

/** Writes Server-Sent Events, honouring backpressure. */
export class SseWriter {
  #written = false;

  constructor(private readonly res: ServerResponse) {}

  /**
   * Whether the response can carry HTTP trailers: only a chunked one, which an HTTP/1.0 caller
   * (or a proxy speaking HTTP/1.0) cannot read. Its stream ends by closing the connection, and the
   * cost comes only in the final event.
   */
  get trailersAllowed(): boolean {
    return this.res.req.httpVersionMajor > 1 || this.res.req.httpVersionMinor >= 1;
  }

  /**
   * Sets the status line and SSE headers. They leave with the first events, in the same write
   * (one packet, no separate round of the caller's parser before the first byte of the body),
   * or with flush() when there are none to send yet.
   */
  open(headers: Record<string, string>): void {
    // A draining server (http/drain.ts) has set `Connection: close` already: it stays.
    const close = !this.trailersAllowed || this.res.getHeader("connection") === "close";
    this.res.writeHead(200, {
      ...headers,
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: close ? "close" : "keep-alive",
      "x-accel-buffering": "no",
    });
  }

  /** Sends the headers now if no event has carried them yet. */
  flush(): void {
    if (this.#written || this.res.destroyed) return;
    this.#written = true;
    this.res.flushHeaders();
  }

  /** Sends events; waits when the socket buffer is full. */
  async send(events: readonly SseEvent[]): Promise<void> {
    if (this.res.destroyed || events.length === 0) return;
    const text = events.map((e) => `${e.event ? `event: ${e.event}\n` : ""}data: ${e.data}\n\n`).join("");
    this.#written = true;
    const ok = this.res.write(text);
    if (!ok && !this.res.destroyed) {
      await new Promise<void>((resolve) => {
        const done = () => {
          this.res.off("drain", done);
          this.res.off("close", done);
          resolve();
        };
        this.res.once("drain", done);
        this.res.once("close", done);
      });
    }
  }

  /** Ends the response, with HTTP trailers when given (declared in open()) and it can carry them. */
  end(trailers?: Record<string, string>): void {
    if (this.res.destroyed) return;
    if (trailers && this.trailersAllowed) this.res.addTrailers(trailers);
    this.res.end();
  }
}

/**
 * What a stream does about money once its usage is known, before it ends: settles what must be
 * settled, and answers the fields the caller sees (trailers, and `x_tollgate` in the final event).
 */
export type StreamMoney = (usage: Usage) => Promise<Record<string, string>>;

/** The `x_tollgate` extension of a stream's final event: its cost and the budget left after it. */
export function xTollgate(money: Record<string, string>): { cost?: string; budget_remaining?: string } {
  return { cost: money["x-tollgate-cost"], budget_remaining: money["x-tollgate-budget-remaining"] };
}

/**
 * How the router's stream (OpenAI chat or text completion chunks, then the usage) is written for
 * the caller: passed through (chat, completions) or translated (Responses, Anthropic Messages).
 * One object serves one stream and may keep state across its calls.
 */
export interface StreamFormat {
  /** The events that open the stream, sent once the router's first event is in. */
  start(): SseEvent[];
  /** The events one router chunk (a chunk's JSON bytes) becomes. */
  chunk(bytes: Uint8Array): SseEvent[];
  /** The events that close a finished stream: its usage, and its money fields when billed. */
  finish(usage: Usage, money: Record<string, string> | undefined): SseEvent[];
  /**
   * The events that close a stream which failed after it started; `money` when what was
   * relayed is billed all the same (its upstream or its router lost mid-stream, docs/money.md,
   * "Holds"), told on the final event as `x_tollgate`, as a finished stream tells it.
   */
  fail(error: HttpError, requestId: string, money: Record<string, string> | undefined): SseEvent[];
}

/** A view of a message's bytes as a Buffer, not a copy. */
const view = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);

const EMPTY_CHOICES = Buffer.from('"choices":[]');

/** A usage-only chunk (`"choices":[]`), which is held back until the cost is known. */
function isUsageChunk(bytes: Uint8Array): boolean {
  return view(bytes).includes(EMPTY_CHOICES);
}

/**
 * The OpenAI chat and text completion stream, relayed as the router sends it and ended by
 * `data: [DONE]`. The usage chunk (sent only when the caller asked for usage) is held back until
 * the cost is known, which it then carries as `x_tollgate`; a failure is a final error event
 * without the terminator.
 */
export function passthroughFormat(): StreamFormat {
  let usageChunk: Uint8Array | undefined;
  return {
    start: () => [],
    chunk(bytes) {
      if (isUsageChunk(bytes)) {
        usageChunk = bytes;
        return [];
      }
      return [{ data: view(bytes).toString("utf8") }];
    },
    finish(_usage, money) {
      const events: SseEvent[] = [];
      if (usageChunk) {
        const json = JSON.parse(Buffer.from(usageChunk).toString("utf8")) as Record<string, unknown>;
        if (money) json.x_tollgate = xTollgate(money);
        events.push({ data: JSON.stringify(json) });
      }
      events.push({ data: "[DONE]" });
      return events;
    },
    fail: (error, requestId, money) => [
      {
        data: JSON.stringify({
          ...errorBody(error, requestId),
          ...(money ? { x_tollgate: xTollgate(money) } : {}),
        }),
      },
    ],
  };
}

/**
 * A stream translated from the upstream's chat chunks (Responses, Anthropic Messages) as a
 * format: named events, and the money fields as `x_tollgate` on the event that carries the usage.
 */
export function translatedFormat(t: StreamTranslation): StreamFormat {
  const sse = (events: NamedEvent[]): SseEvent[] =>
    events.map((e) => ({ event: e.event, data: JSON.stringify(e.data) }));
  return {
    start: () => sse(t.start()),
    chunk: (bytes) => sse(t.chunk(JSON.parse(Buffer.from(bytes).toString("utf8")))),
    finish: (usage, money) =>
      sse(
        t.finish(
          {
            inputTokens: usage.inputTokens,
            outputTokens: usage.outputTokens,
            reasoningTokens: usage.reasoningTokens,
          },
          money ? { x_tollgate: xTollgate(money) } : {},
        ),
      ),
    fail: (error, _requestId, money) =>
      sse(
        t.fail(
          { status: error.status, code: error.code, message: error.message },
          money ? { x_tollgate: xTollgate(money) } : {},
        ),
      ),
  };
}

/**
 * Relays InferenceService.StreamComplete to the caller as SSE in the given format (default: the
 * OpenAI chunks, ending in `data: [DONE]`). The first event is awaited before any header is
 * sent, so a refusal still reaches the caller as a JSON error with its status; a failure after
 * that becomes the format's closing error events. The caller going away ends the relay quietly.
 */
export async function relayStream(
  req: FastifyRequest,
  reply: FastifyReply,
  stream: AsyncIterable<StreamCompleteResponse>,
  signal: AbortSignal,
  money?: StreamMoney,
  /** Called with the error when the stream fails before its first event. */
  onNoStart?: (err: unknown) => Promise<void>,
  /**
   * Called when the stream fails after some chunks were relayed (not because the caller went
   * away), with the usage event the router sent along with the last relayed chunk and the
   * failure: the router may be gone without recording it, so it is recorded under the same event
   * id (stored once). Answers the money fields of that charge, which the stream's error event
   * and trailers then carry, as a finished stream's do; undefined when nothing is charged.
   */
  onLost?: (usageSoFar: UsageRecorded, err: unknown) => Promise<Record<string, string> | undefined>,
  format: StreamFormat = passthroughFormat(),
): Promise<FastifyReply> {
  const events = stream[Symbol.asyncIterator]();
  let next: IteratorResult<StreamCompleteResponse>;
  try {
    next = await events.next();
  } catch (err) {
    await onNoStart?.(err);
    throw err;
  }
  reply.hijack();
  const sse = new SseWriter(reply.raw);
  // Headers set before the hijack (RateLimit-*, the budget left with the hold taken) go out too.
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(reply.getHeaders()))
    if (value !== undefined) headers[name] = String(value);
  // The cost is known only at the end: it follows as HTTP trailers (when the caller's HTTP
  // version has them) and in the format's final event as `x_tollgate`.
  if (money && sse.trailersAllowed) headers.trailer = "x-tollgate-cost, x-tollgate-budget-remaining";
  sse.open({ ...headers, "x-request-id": req.id });
  const started = performance.now();
  let outcome = "completed";
  let usageSoFar: UsageRecorded | undefined;
  try {
    await sse.send(format.start());
    let trailers: Record<string, string> | undefined;
    let usage: Usage | undefined;
    while (!next.done) {
      const event = next.value.event;
      if (event.case === "chunk") {
        await sse.send(format.chunk(event.value));
        usageSoFar = next.value.usageSoFar ?? usageSoFar;
      } else if (event.case === "usage") {
        usage = event.value;
        if (money) trailers = await money(event.value);
      }
      // The first event was in hand when the headers were set: they are out by now, with it
      // or (when it wrote nothing, e.g. a usage chunk held back) on their own.
      sse.flush();
      next = await events.next();
    }
    // Usage is the last message of every finished stream: a stream that stops without it lost
    // its router (a killed process can end the call without an error status).
    if (!usage)
      throw new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "the stream ended without its usage");
    await sse.send(format.finish(usage, trailers));
    sse.end(trailers);
  } catch (err) {
    if (signal.aborted) {
      outcome = "client_cancelled";
    } else {
      outcome = "failed";
      // What was relayed is billed: the caller is told that charge, exactly as it is recorded.
      const billed = usageSoFar ? await onLost?.(usageSoFar, err) : undefined;
      await sse.send(format.fail(toHttpError(err, req.log), req.id, billed));
      sse.end(money ? billed : undefined);
    }
  }
  req.log.debug({ outcome, ms: Math.round(performance.now() - started) }, "stream ended");
  return reply;
}

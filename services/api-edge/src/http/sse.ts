import type { ServerResponse } from "node:http";
import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import type { StreamCompleteResponse, Usage } from "@tollgate/proto/inference";
import type { UsageRecorded } from "@tollgate/proto/usage";
import type { FastifyReply, FastifyRequest } from "fastify";
import { errorBody, toHttpError } from "./errors.js";

/** Writes Server-Sent Events for an OpenAI-compatible stream, honouring backpressure. */
export class SseWriter {
  constructor(private readonly res: ServerResponse) {}

  /** Sends the status line and SSE headers. */
  open(headers: Record<string, string>): void {
    this.res.writeHead(200, {
      ...headers,
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    });
    this.res.flushHeaders();
  }

  /** Sends one `data:` event; waits when the socket buffer is full. */
  async data(payload: string | Uint8Array): Promise<void> {
    if (this.res.destroyed) return;
    const ok = this.res.write(
      `data: ${typeof payload === "string" ? payload : Buffer.from(payload).toString("utf8")}\n\n`,
    );
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

  /** Ends the stream with the OpenAI terminator, and HTTP trailers when given (declared in open()). */
  end(trailers?: Record<string, string>): void {
    if (this.res.destroyed) return;
    this.res.write("data: [DONE]\n\n");
    if (trailers) this.res.addTrailers(trailers);
    this.res.end();
  }

  /** Ends the stream without the terminator (after an error event). */
  close(): void {
    if (!this.res.destroyed) this.res.end();
  }
}

/**
 * Relays InferenceService.StreamComplete to the caller as OpenAI-compatible SSE ending in
 * `data: [DONE]`. The first event is awaited before any header is sent, so a refusal still
 * reaches the caller as a JSON error with its status; a failure after that becomes a final
 * error event without the terminator. The caller going away ends the relay quietly.
 */
/**
 * What a stream does about money once its usage is known, before it ends: settles what must be
 * settled, and answers the fields the caller sees (trailers, and `x_tollgate` in the usage chunk).
 */
export type StreamMoney = (usage: Usage) => Promise<Record<string, string>>;

/** A usage-only chunk (`"choices":[]`), which is held back until the cost is known. */
function isUsageChunk(bytes: Uint8Array): boolean {
  return Buffer.from(bytes).includes('"choices":[]');
}

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
   * away), with the usage event the router sent along with the last relayed chunk: the router
   * may be gone without recording it, so it is recorded under the same event id (stored once).
   */
  onLost?: (usageSoFar: UsageRecorded) => Promise<void>,
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
  // The cost is known only at the end: it follows as HTTP trailers and, when the caller asked for
  // usage, inside the usage chunk as `x_tollgate`.
  if (money) headers.trailer = "x-tollgate-cost, x-tollgate-budget-remaining";
  sse.open({ ...headers, "x-request-id": req.id });
  const started = performance.now();
  let outcome = "completed";
  let usageSoFar: UsageRecorded | undefined;
  try {
    let usageChunk: Uint8Array | undefined;
    let trailers: Record<string, string> | undefined;
    let ended = false;
    while (!next.done) {
      const event = next.value.event;
      if (event.case === "chunk") {
        if (money && isUsageChunk(event.value)) usageChunk = event.value;
        else await sse.data(event.value);
        usageSoFar = next.value.usageSoFar ?? usageSoFar;
      } else if (event.case === "usage") {
        ended = true;
        if (money) trailers = await money(event.value);
      }
      next = await events.next();
    }
    // Usage is the last message of every finished stream: a stream that stops without it lost
    // its router (a killed process can end the call without an error status).
    if (!ended)
      throw new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "the stream ended without its usage");
    if (usageChunk) {
      const json = JSON.parse(Buffer.from(usageChunk).toString("utf8")) as Record<string, unknown>;
      if (trailers)
        json.x_tollgate = {
          cost: trailers["x-tollgate-cost"],
          budget_remaining: trailers["x-tollgate-budget-remaining"],
        };
      await sse.data(JSON.stringify(json));
    }
    sse.end(trailers);
  } catch (err) {
    if (signal.aborted) {
      outcome = "client_cancelled";
    } else {
      outcome = "failed";
      if (usageSoFar) await onLost?.(usageSoFar);
      await sse.data(JSON.stringify(errorBody(toHttpError(err, req.log), req.id)));
      sse.close();
    }
  }
  req.log.debug({ outcome, ms: Math.round(performance.now() - started) }, "stream ended");
  return reply;
}

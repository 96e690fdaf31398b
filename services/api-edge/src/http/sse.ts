import type { ServerResponse } from "node:http";
import type { StreamCompleteResponse } from "@tollgate/proto/inference";
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

  /** Ends the stream with the OpenAI terminator. */
  end(): void {
    if (!this.res.destroyed) this.res.end("data: [DONE]\n\n");
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
export async function relayStream(
  req: FastifyRequest,
  reply: FastifyReply,
  stream: AsyncIterable<StreamCompleteResponse>,
  signal: AbortSignal,
): Promise<FastifyReply> {
  const events = stream[Symbol.asyncIterator]();
  let next = await events.next();
  reply.hijack();
  const sse = new SseWriter(reply.raw);
  // Headers set before the hijack (RateLimit-*, the budget left with the hold taken) go out too.
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(reply.getHeaders()))
    if (value !== undefined) headers[name] = String(value);
  sse.open({ ...headers, "x-request-id": req.id });
  const started = performance.now();
  let outcome = "completed";
  try {
    while (!next.done) {
      const event = next.value.event;
      if (event.case === "chunk") await sse.data(event.value);
      next = await events.next();
    }
    sse.end();
  } catch (err) {
    if (signal.aborted) {
      outcome = "client_cancelled";
    } else {
      outcome = "failed";
      await sse.data(JSON.stringify(errorBody(toHttpError(err, req.log), req.id)));
      sse.close();
    }
  }
  req.log.debug({ outcome, ms: Math.round(performance.now() - started) }, "stream ended");
  return reply;
}

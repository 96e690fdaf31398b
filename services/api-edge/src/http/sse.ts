import type { ServerResponse } from "node:http";

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

import { Agent, type IncomingHttpHeaders, request } from "node:http";

/** One keep-alive agent for every node:http request of the benchmark (streams and the paid door). */
export const agent = new Agent({ keepAlive: true, maxSockets: 64 });

export interface HttpResult {
  status: number;
  headers: IncomingHttpHeaders;
  rawHeaders: string[];
  body: string;
  /** From the request's start to the last byte of the answer. */
  ms: number;
}

export interface SendInit {
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  timeoutMs?: number;
}

/** A buffered request over node:http, timed from start to the last byte. */
export function send(url: string, init: SendInit = {}): Promise<HttpResult> {
  const headers: Record<string, string> = { ...init.headers };
  if (init.body !== undefined) headers["content-length"] = String(Buffer.byteLength(init.body));
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const req = request(url, { method: init.method ?? "GET", headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", reject);
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          rawHeaders: res.rawHeaders,
          body: Buffer.concat(chunks).toString("utf8"),
          ms: performance.now() - started,
        }),
      );
    });
    req.on("error", reject);
    req.setTimeout(init.timeoutMs ?? 30_000, () => req.destroy(new Error(`${url} timed out`)));
    req.end(init.body);
  });
}

/** One exchange seen by {@link timedFetch}. */
export interface Exchange {
  /** The request carried `Authorization: Payment …`. */
  paid: boolean;
  status: number;
  ms: number;
}

/**
 * A fetch over node:http (the same client as the account-door requests it is compared with),
 * reporting each exchange's time. For PaidSession, which takes a fetch.
 */
export function timedFetch(onExchange: (e: Exchange) => void): typeof fetch {
  return (async (input: string | URL | Request, init?: RequestInit) => {
    const url = input instanceof Request ? input.url : String(input);
    const headers: Record<string, string> = {};
    new Headers(init?.headers).forEach((v, k) => {
      headers[k] = v;
    });
    const raw = init?.body;
    if (raw !== undefined && raw !== null && typeof raw !== "string") {
      throw new Error("timedFetch sends string bodies only");
    }
    const r = await send(url, {
      method: init?.method ?? "GET",
      headers,
      ...(typeof raw === "string" ? { body: raw } : {}),
    });
    onExchange({ paid: /^\s*payment\s/i.test(headers["authorization"] ?? ""), status: r.status, ms: r.ms });
    const out = new Headers();
    for (let i = 0; i + 1 < r.rawHeaders.length; i += 2) out.append(r.rawHeaders[i]!, r.rawHeaders[i + 1]!);
    const nullBody = r.status === 204 || r.status === 205 || r.status === 304;
    return new Response(nullBody ? null : r.body, { status: r.status, headers: out });
  }) as typeof fetch;
}

/** One streamed completion as the caller saw it. */
export interface StreamResult {
  status: number;
  /** Request start → the first byte of the body (the first SSE bytes). */
  ttfbMs: number;
  /** Request start → the first `data:` event carrying content. */
  ttftMs: number;
  /** Arrival gaps between consecutive content events. */
  gaps: number[];
  contentChunks: number;
  done: boolean;
  totalMs: number;
}

function hasContent(data: string): boolean {
  try {
    const chunk = JSON.parse(data) as { choices?: Array<{ delta?: { content?: unknown }; text?: unknown }> };
    const c = chunk.choices?.[0];
    const text = c?.delta?.content ?? c?.text;
    return typeof text === "string" && text.length > 0;
  } catch {
    return false;
  }
}

/** Streams one completion over node:http and times every content event's arrival. */
export function streamOnce(
  url: string,
  headers: Record<string, string>,
  body: string,
): Promise<StreamResult> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const req = request(
      url,
      {
        method: "POST",
        headers: { ...headers, "content-length": String(Buffer.byteLength(body)) },
        agent,
      },
      (res) => {
        res.setEncoding("utf8");
        let buffer = "";
        let ttfbMs = Number.NaN;
        let ttftMs = Number.NaN;
        let last = Number.NaN;
        let contentChunks = 0;
        let done = false;
        const gaps: number[] = [];
        res.on("data", (text: string) => {
          const now = performance.now();
          if (Number.isNaN(ttfbMs)) ttfbMs = now - started;
          buffer += text;
          for (let end = buffer.indexOf("\n\n"); end !== -1; end = buffer.indexOf("\n\n")) {
            const event = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            for (const line of event.split("\n")) {
              if (!line.startsWith("data:")) continue;
              const data = line.slice(5).trim();
              if (data === "[DONE]") {
                done = true;
                continue;
              }
              if (!hasContent(data)) continue;
              contentChunks++;
              if (Number.isNaN(ttftMs)) ttftMs = now - started;
              else gaps.push(now - last);
              last = now;
            }
          }
        });
        res.on("error", reject);
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            ttfbMs,
            ttftMs,
            gaps,
            contentChunks,
            done,
            totalMs: performance.now() - started,
          }),
        );
      },
    );
    req.on("error", reject);
    req.setTimeout(30_000, () => req.destroy(new Error(`${url} timed out`)));
    req.end(body);
  });
}

import { type IncomingMessage, type Server, type ServerResponse, STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import { newRequestId } from "@tollgate/kit/ids";
import type { FastifyBaseLogger, FastifyHttpOptions, FastifyInstance } from "fastify";
import { EdgeError } from "../domain/errors.js";
import { CHAT_LIMITS } from "../schemas/chat.js";
import { errorAnswerFor, type HttpError, httpErrorOf } from "./errors.js";

/** The public port's limits on hostile or careless input (docs/account-door.md, "Limits"). */
export interface EdgeLimits {
  /** Request body; above it 413 payload_too_large. */
  bodyLimitBytes: number;
  /** JSON nesting (objects and arrays); above it 400 json_too_deep. */
  maxJsonDepth: number;
  /** Chat messages, Responses input items, text-completion prompts; above it 400 invalid_request. */
  maxMessages: number;
  /** Request line and headers together (Node's maxHeaderSize); above it 431 headers_too_large. */
  maxHeaderBytes: number;
  /** Time to receive the request line and headers; then 408 request_timeout and the connection closes. */
  headersTimeoutMs: number;
  /** Time to receive the whole request, body included; then 408 request_timeout and the connection closes. */
  requestTimeoutMs: number;
  /** A connection idle this long (no byte either way) is closed; above the upstream timeout (120 s). */
  connectionTimeoutMs: number;
  /** Open connections; those above it are closed at once; 0 is unlimited. */
  maxConnections: number;
}

export const DEFAULT_LIMITS: EdgeLimits = {
  bodyLimitBytes: 4 * 1024 * 1024,
  maxJsonDepth: 64,
  maxMessages: CHAT_LIMITS.maxMessages,
  maxHeaderBytes: 16 * 1024,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  connectionTimeoutMs: 180_000,
  maxConnections: 10_000,
};

/**
 * How often Node looks for requests over headersTimeout/requestTimeout (its default, 30 s,
 * would let a slow caller hold a connection up to 30 s past the limit): a quarter of the
 * shorter one, between 100 ms and 1 s.
 */
function checkingIntervalMs(l: EdgeLimits): number {
  return Math.max(100, Math.min(1_000, Math.floor(Math.min(l.headersTimeoutMs, l.requestTimeoutMs) / 4)));
}

/** A refusal the HTTP parser makes before fastify sees a request, by Node's error code. */
function clientErrorOf(code: string | undefined): HttpError {
  if (code === "HPE_HEADER_OVERFLOW")
    return httpErrorOf("headers_too_large", "the request headers are too large");
  if (code === "ERR_HTTP_REQUEST_TIMEOUT") {
    return httpErrorOf("request_timeout", "the request was not received in time");
  }
  return httpErrorOf("invalid_request", "the request is not valid HTTP");
}

/** The path of the request line the parser had read when it refused (none for a slow caller). */
function pathOf(rawPacket: unknown): string | undefined {
  if (!Buffer.isBuffer(rawPacket)) return undefined;
  const line = rawPacket.subarray(0, 2048).toString("latin1").split("\r\n", 1)[0];
  const target = line?.split(" ")[1];
  return target?.split("?")[0];
}

/**
 * Answers what Node's HTTP parser refuses (malformed requests, oversized headers, slow
 * callers) with the error body every other refusal of its route gets (errorAnswerFor), then
 * closes the connection: after a parse error the stream cannot be trusted.
 */
export function clientErrorHandler(log: FastifyBaseLogger) {
  // rawPacket: the bytes the parser held when it refused (a Buffer, whatever fastify's types say).
  return (err: Error & { code?: string; rawPacket?: unknown }, socket: Socket): void => {
    if (err.code === "ECONNRESET" || socket.destroyed) return;
    const e = clientErrorOf(err.code);
    log.info({ code: e.code, parserCode: err.code }, "request refused by the HTTP parser");
    // As Node itself does: answer unless a response of this connection has begun (an earlier
    // response on a kept-alive connection is no reason to leave the caller without one).
    const inFlight = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (socket.writable && !inFlight?.headersSent) writeAnswer(socket, pathOf(err.rawPacket), e);
    socket.destroy();
  };
}

/** Writes `e` on a socket no response object owns, in its route's shape, saying the connection closes. */
function writeAnswer(socket: Socket, path: string | undefined, e: HttpError): void {
  const requestId = newRequestId();
  const answer = errorAnswerFor(path, e, requestId);
  const body = JSON.stringify(answer.body);
  const headers = Object.entries({ "x-request-id": requestId, ...answer.headers })
    .map(([name, value]) => `${name}: ${value}\r\n`)
    .join("");
  socket.write(
    `HTTP/1.1 ${e.status} ${STATUS_CODES[e.status]}\r\nContent-Type: ${answer.contentType}\r\n${headers}` +
      `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}

/**
 * Requests Node answers before any route runs, answered with the usual error body instead:
 * CONNECT, which Node hands to a `connect` listener and otherwise answers by closing the
 * connection without a word (400: the gateway is no proxy); and an `Expect` other than
 * `100-continue`, which Node otherwise answers with a bare 417 (417 `expectation_failed`, the
 * connection closed, the body unread).
 */
export function refuseUnroutable(server: Server): void {
  server.on("checkExpectation", (req: IncomingMessage, res: ServerResponse) => {
    const path = req.url?.split("?")[0];
    const asked = String(req.headers.expect).slice(0, 64);
    const e = httpErrorOf("expectation_failed", `Expect: ${asked} is not met here; only 100-continue is`);
    const requestId = newRequestId();
    const answer = errorAnswerFor(path, e, requestId);
    const body = JSON.stringify(answer.body);
    res.shouldKeepAlive = false;
    res.writeHead(e.status, {
      "content-type": answer.contentType,
      "content-length": Buffer.byteLength(body),
      "x-request-id": requestId,
      ...answer.headers,
    });
    res.end(body);
  });
  server.on("connect", (req: IncomingMessage, socket: Socket) => {
    socket.on("error", () => {});
    writeAnswer(socket, req.url, httpErrorOf("invalid_request", "CONNECT is not served: this is no proxy"));
    socket.end();
  });
}

/**
 * Header rules every request meets before anything else, each a 400 invalid_request with the
 * usual error body: HTTP/1.1 requires one Host header, not several (RFC 9112, 3.2); and `Authorization` is a
 * single field (RFC 9110, 11.6.2). Node keeps only the first of several, so a second one (a
 * Payment credential after a Virtual Key, or another key) would be dropped without a word and
 * the request judged on the first: it is refused instead (docs/contract.md, "Authentication").
 */
export function requireHost(app: FastifyInstance): void {
  app.addHook("onRequest", async (req) => {
    if (req.raw.httpVersion === "1.1" && req.headers.host === undefined) {
      throw new EdgeError("invalid_request", "an HTTP/1.1 request needs a Host header");
    }
    // Node keeps the first Host of several: another reader of the same bytes may take the last.
    if (req.headers.host !== undefined && fieldCount(req.raw.rawHeaders, "host") > 1) {
      throw new EdgeError("invalid_request", "send one Host header, not several");
    }
    if (req.headers.authorization !== undefined && fieldCount(req.raw.rawHeaders, "authorization") > 1) {
      throw new EdgeError("invalid_request", "send one Authorization header, not several");
    }
  });
}

/** How many fields named `name` (lower case) a request's raw header list holds. */
function fieldCount(raw: readonly string[], name: string): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const field = raw[i]!;
    if (field.length === name.length && field.toLowerCase() === name) n++;
  }
  return n;
}

/**
 * The largest oversized body api-edge reads to its end (and discards) before it answers 413:
 * four times the body limit, 16 MiB by default. Beyond it the 413 is sent at once and the
 * connection closed, which a caller still writing may see as a reset instead of the answer.
 */
export function bodyDrainBytes(limits: EdgeLimits): number {
  return 4 * limits.bodyLimitBytes;
}

/**
 * Reads and discards what is left of `raw`'s body, at most `budget` more bytes. Resolves true
 * when the body was read to its end, false when it went over `budget` (reading stops) or the
 * caller went away first.
 */
export function discardBody(raw: IncomingMessage, budget: number): Promise<boolean> {
  if (raw.complete) return Promise.resolve(true);
  return new Promise((resolve) => {
    let seen = 0;
    const finish = (whole: boolean) => {
      raw.off("data", onData);
      raw.off("end", onEnd);
      raw.off("close", onClose);
      raw.off("error", onClose);
      if (!whole) raw.pause();
      resolve(whole);
    };
    const onData = (chunk: Buffer) => {
      seen += chunk.length;
      if (seen > budget) finish(false);
    };
    const onEnd = () => finish(true);
    const onClose = () => finish(raw.complete);
    raw.on("data", onData);
    raw.once("end", onEnd);
    raw.once("close", onClose);
    raw.once("error", onClose);
    raw.resume();
  });
}

/**
 * An oversized body gets its 413 after the caller has sent it. fastify refuses a body over
 * `bodyLimit` on its Content-Length before reading a byte, or stops reading a chunked one at
 * the limit, and the answer closes the connection; a caller still writing then meets a
 * closed socket (EPIPE, a reset) and may never read the 413. So, before the error handler
 * answers, the rest of the body is read and discarded, up to bodyDrainBytes in all; a body
 * declared larger than that is not read at all. The time it may take is bounded by
 * requestTimeoutMs, like any body.
 *
 * A caller that asks `Expect: 100-continue` (curl does for any body above 1 MiB) waits for
 * the 100 before it sends its body: one declared above the limit is not invited, and gets its
 * 413 at once instead (RFC 9110, 10.1.1), with nothing to read or discard; anything else gets
 * its 100 Continue as Node would send it.
 */
export function drainOversizedBodies(app: FastifyInstance, limits: EdgeLimits): void {
  const drainBytes = bodyDrainBytes(limits);
  /** Requests whose 100 Continue was withheld: their body never comes. */
  const uninvited = new WeakSet<IncomingMessage>();
  app.server.on("checkContinue", (req: IncomingMessage, res: ServerResponse) => {
    if (Number(req.headers["content-length"]) > limits.bodyLimitBytes) uninvited.add(req);
    else res.writeContinue();
    app.server.emit("request", req, res);
  });
  app.addHook("onError", async (req, _reply, err) => {
    if ((err as { code?: string }).code !== "FST_ERR_CTP_BODY_TOO_LARGE") return;
    if (uninvited.has(req.raw)) return;
    const declared = Number(req.headers["content-length"]);
    // Refused on its Content-Length, nothing read yet; else fastify read up to the limit.
    const read = declared > limits.bodyLimitBytes ? 0 : limits.bodyLimitBytes;
    if (declared > drainBytes) return;
    await discardBody(req.raw, drainBytes - read);
  });
}

/** fastify's server options that enforce `limits`. */
export function serverOptions(
  limits: EdgeLimits,
  log: FastifyBaseLogger,
): FastifyHttpOptions<Server, FastifyBaseLogger> {
  return {
    bodyLimit: limits.bodyLimitBytes,
    connectionTimeout: limits.connectionTimeoutMs,
    requestTimeout: limits.requestTimeoutMs,
    clientErrorHandler: clientErrorHandler(log),
    http: {
      maxHeaderSize: limits.maxHeaderBytes,
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      connectionsCheckingInterval: checkingIntervalMs(limits),
      // Node would refuse a request without Host with a bare 400; requireHost does it with a body.
      requireHostHeader: false,
    },
  };
}

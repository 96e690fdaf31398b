import { type Server, STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import { newRequestId } from "@tollgate/kit/ids";
import type { FastifyBaseLogger, FastifyHttpOptions, FastifyInstance } from "fastify";
import { EdgeError } from "../domain/errors.js";
import { CHAT_LIMITS } from "../schemas/chat.js";
import { errorBody, type HttpError } from "./errors.js";

/** The public port's limits on hostile or careless input (README, "Limits"). */
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
  if (code === "HPE_HEADER_OVERFLOW") {
    return {
      status: 431,
      type: "invalid_request_error",
      code: "headers_too_large",
      message: "the request headers are too large",
    };
  }
  if (code === "ERR_HTTP_REQUEST_TIMEOUT") {
    return {
      status: 408,
      type: "invalid_request_error",
      code: "request_timeout",
      message: "the request was not received in time",
    };
  }
  return {
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    message: "the request is not valid HTTP",
  };
}

/**
 * Answers what Node's HTTP parser refuses (malformed requests, oversized headers, slow
 * callers) with the same OpenAI-shaped error body as every other refusal, then closes the
 * connection: after a parse error the stream cannot be trusted.
 */
export function clientErrorHandler(log: FastifyBaseLogger) {
  return (err: Error & { code?: string }, socket: Socket): void => {
    if (err.code === "ECONNRESET" || socket.destroyed) return;
    const e = clientErrorOf(err.code);
    log.info({ code: e.code, parserCode: err.code }, "request refused by the HTTP parser");
    // As Node itself does: answer unless a response of this connection has begun (an earlier
    // response on a kept-alive connection is no reason to leave the caller without one).
    const inFlight = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (socket.writable && !inFlight?.headersSent) {
      const body = JSON.stringify(errorBody(e, newRequestId()));
      socket.write(
        `HTTP/1.1 ${e.status} ${STATUS_CODES[e.status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
      );
    }
    socket.destroy();
  };
}

/**
 * HTTP/1.1 requires a Host header (RFC 9112, 3.2): a request without one is a 400
 * invalid_request with the usual error body.
 */
export function requireHost(app: FastifyInstance): void {
  app.addHook("onRequest", async (req) => {
    if (req.raw.httpVersion === "1.1" && req.headers.host === undefined) {
      throw new EdgeError("invalid_request", "an HTTP/1.1 request needs a Host header");
    }
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

import type { IncomingHttpHeaders } from "node:http";
import { EdgeError } from "../domain/errors.js";

/**
 * The Virtual Key of an account-door request (docs/contract.md, "Authentication"): only
 * `Authorization: Bearer`; a Payment credential or a key in another field is a 401.
 */
export function bearerKey(headers: IncomingHttpHeaders): string {
  const auth = headers.authorization;
  // A key in another field is refused even beside a Bearer one: nothing else is read, so
  // nothing else may look as if it counted.
  if (hasKeyField(headers)) {
    throw new EdgeError(
      "wrong_auth_field",
      auth === undefined || auth.trim() === ""
        ? "send the Virtual Key as Authorization: Bearer <key>"
        : "send the Virtual Key once, as Authorization: Bearer <key>; x-api-key and api-key are not read here",
    );
  }
  if (auth === undefined || auth.trim() === "") {
    throw new EdgeError("missing_api_key", "no Virtual Key was sent; use Authorization: Bearer <key>");
  }
  const space = auth.indexOf(" ");
  const scheme = (space === -1 ? auth : auth.slice(0, space)).toLowerCase();
  const value = space === -1 ? "" : auth.slice(space + 1).trim();
  if (scheme === "payment") {
    throw new EdgeError(
      "wrong_auth_scheme",
      "Payment credentials are accepted only on /v1/mpp/chat/completions; this route takes Authorization: Bearer",
    );
  }
  if (scheme !== "bearer")
    throw new EdgeError("wrong_auth_scheme", "this route takes Authorization: Bearer <key>");
  if (value === "")
    throw new EdgeError("missing_api_key", "no Virtual Key was sent; use Authorization: Bearer <key>");
  return value;
}

/** Whether a key stands in `x-api-key` or `api-key`, the fields other APIs read a key from. */
export function hasKeyField(headers: IncomingHttpHeaders): boolean {
  return headers["x-api-key"] !== undefined || headers["api-key"] !== undefined;
}

/** How a route reads the Virtual Key from the request's headers. */
export type KeyReader = (headers: IncomingHttpHeaders) => string;

/**
 * The Virtual Key of an Anthropic Messages request: `x-api-key`, as Anthropic's API takes it,
 * or `Authorization: Bearer` (how Anthropic's TypeScript SDK 1.x sends its `apiKey`), not both.
 */
export function anthropicKey(headers: IncomingHttpHeaders): string {
  // `api-key` (Azure's field) is not read here either: refused, alone or beside another key.
  if (headers["api-key"] !== undefined) {
    throw new EdgeError(
      "wrong_auth_field",
      "send the Virtual Key as x-api-key or Authorization: Bearer; api-key is not read here",
    );
  }
  const apiKey = headers["x-api-key"];
  if (apiKey === undefined) {
    if (headers.authorization === undefined || headers.authorization.trim() === "")
      throw new EdgeError("missing_api_key", "no Virtual Key was sent; use x-api-key: <key>");
    return bearerKey(headers);
  }
  if (headers.authorization !== undefined)
    throw new EdgeError(
      "wrong_auth_field",
      "send the Virtual Key once: x-api-key or Authorization: Bearer, not both",
    );
  const value = (Array.isArray(apiKey) ? apiKey[0] : apiKey)?.trim() ?? "";
  if (value === "") throw new EdgeError("missing_api_key", "no Virtual Key was sent; use x-api-key: <key>");
  return value;
}

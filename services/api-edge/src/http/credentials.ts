import type { IncomingHttpHeaders } from "node:http";
import { EdgeError } from "../domain/errors.js";

/**
 * The Virtual Key of an account-door request (docs/contract.md, "Authentication"): only
 * `Authorization: Bearer`; a Payment credential or a key in another field is a 401.
 */
export function bearerKey(headers: IncomingHttpHeaders): string {
  const auth = headers.authorization;
  if (auth === undefined || auth.trim() === "") {
    if (headers["x-api-key"] !== undefined || headers["api-key"] !== undefined) {
      throw new EdgeError("wrong_auth_field", "send the Virtual Key as Authorization: Bearer <key>");
    }
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

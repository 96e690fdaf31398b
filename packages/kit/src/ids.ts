import { randomBytes } from "node:crypto";

const SAFE_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** Returns a new request id: "req_" and 24 hex characters. */
export function newRequestId(): string {
  return `req_${randomBytes(12).toString("hex")}`;
}

/** Accepts a caller-supplied request id only when it is short and printable; otherwise makes one. */
export function acceptRequestId(candidate: string | undefined): string {
  return candidate !== undefined && SAFE_ID.test(candidate) ? candidate : newRequestId();
}

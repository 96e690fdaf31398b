// The failure a client call rejects with, and the trailing metadata keys that carry a domain
// error across a gRPC boundary: shared by the server bridge (grpc.ts) and the client channel
// (channel.ts).
import type { status } from "@grpc/grpc-js";

/** Trailing metadata key carrying a domain error code across a gRPC boundary. */
export const ERROR_CODE_KEY = "tollgate-code";

/** Prefix of every trailing metadata key the bridge writes: the code and each detail. */
export const ERROR_DETAIL_PREFIX = "tollgate-";

/** Machine-readable facts about a failure (e.g. retry-after seconds), as strings. */
export type ErrorDetails = Readonly<Record<string, string>>;

/**
 * A failure received from a remote gRPC service, with the domain code when it sent one and
 * the details it attached (empty when none).
 */
export class RemoteError extends Error {
  constructor(
    readonly status: status,
    readonly code: string | undefined,
    message: string,
    readonly details: ErrorDetails = {},
  ) {
    super(message);
    this.name = "RemoteError";
  }
}

/**
 * The RemoteError a failed call's status tells: `fields` is its trailing metadata (grpc-js
 * Metadata's map, or HTTP/2 trailers), whose `tollgate-code` is the domain code and whose other
 * `tollgate-*` text entries are the details.
 */
export function remoteErrorOf(
  code: status,
  message: string,
  fields: Readonly<Record<string, unknown>>,
): RemoteError {
  const domain = fields[ERROR_CODE_KEY];
  const details: Record<string, string> = {};
  for (const [key, value] of Object.entries(fields)) {
    if (key !== ERROR_CODE_KEY && key.startsWith(ERROR_DETAIL_PREFIX) && typeof value === "string")
      details[key.slice(ERROR_DETAIL_PREFIX.length)] = value;
  }
  return new RemoteError(code, typeof domain === "string" ? domain : undefined, message, details);
}

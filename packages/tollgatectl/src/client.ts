import type { AdminRequest } from "./args.js";

/** The admin API refused the call, or could not be reached (exit code 1). */
export class ApiError extends Error {
  constructor(
    /** HTTP status; 0 when no answer arrived. */
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** Default deadline of one call. */
const TIMEOUT_MS = 30_000;

/**
 * Sends one admin API call with the admin token and returns the JSON answer. Any non-2xx answer
 * becomes an ApiError carrying the API's own message and code (its `{ error: { … } }` body).
 */
export async function callAdmin(
  baseUrl: string,
  token: string,
  request: AdminRequest,
  fetchImpl: typeof fetch = fetch,
): Promise<unknown> {
  const url = `${baseUrl.replace(/\/+$/, "")}${request.path}`;
  let res: Response;
  try {
    res = await fetchImpl(url, {
      method: request.method,
      headers: {
        authorization: `Bearer ${token}`,
        accept: "application/json",
        ...(request.body ? { "content-type": "application/json" } : {}),
      },
      ...(request.body ? { body: JSON.stringify(request.body) } : {}),
      signal: AbortSignal.timeout(TIMEOUT_MS),
    });
  } catch (err) {
    const cause = (err as { cause?: { code?: string } }).cause?.code ?? (err as Error).name;
    throw new ApiError(0, "unreachable", `cannot reach the admin API at ${baseUrl} (${cause})`);
  }
  const text = await res.text();
  let body: unknown;
  try {
    body = text === "" ? undefined : JSON.parse(text);
  } catch {
    body = undefined;
  }
  if (!res.ok) {
    const error = (body as { error?: { message?: unknown; code?: unknown } } | undefined)?.error;
    const message = typeof error?.message === "string" ? error.message : `HTTP ${res.status}`;
    const code = typeof error?.code === "string" ? error.code : `http_${res.status}`;
    throw new ApiError(res.status, code, message);
  }
  if (body === undefined) throw new ApiError(res.status, "invalid_response", "the admin API sent no JSON");
  return body;
}

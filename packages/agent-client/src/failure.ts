/**
 * The one line tollgate-pay prints for a failure that is neither the gateway's answer nor a usage
 * error: which address could not be reached and why, instead of undici's bare "fetch failed" or
 * viem's "HTTP request failed.". Addresses are shown as their origin only: an RPC URL may carry
 * an API key in its path.
 */
export function describeFailure(error: unknown, gatewayUrl: string | undefined): string {
  const rpc = findCause(error, (e) => e.name === "HttpRequestError") as
    | (Error & { url?: string; status?: number })
    | undefined;
  if (rpc) {
    const where = `the chain RPC at ${originOf(rpc.url ?? "")}`;
    return rpc.status ? `${where} answered HTTP ${rpc.status}` : `cannot reach ${where} (${reasonOf(rpc)})`;
  }
  if (error instanceof TypeError && error.message === "fetch failed") {
    const where = gatewayUrl ? `the gateway at ${originOf(gatewayUrl)}` : "the gateway";
    return `cannot reach ${where} (${reasonOf(error)})`;
  }
  return String((error as Error)?.message ?? error).split("\n")[0]!;
}

/** The first error in `error`'s cause chain that `match` accepts. */
function findCause(error: unknown, match: (e: Error) => boolean): Error | undefined {
  for (let e = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++)
    if (match(e)) return e;
  return undefined;
}

/**
 * The deepest system error code in the cause chain (ECONNREFUSED, ENOTFOUND, …), else the first
 * line of the deepest error's short message: never a viem error's full message, which names the
 * whole URL (an RPC's API key in its path) and the request body.
 */
function reasonOf(error: Error): string {
  let code: string | undefined;
  let deepest = error;
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const c = (e as NodeJS.ErrnoException).code;
    if (typeof c === "string") code = c;
    deepest = e;
  }
  const short = (deepest as Error & { shortMessage?: string }).shortMessage ?? deepest.message;
  return code ?? short.split("\n")[0]!;
}

function originOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "(an invalid URL)";
  }
}

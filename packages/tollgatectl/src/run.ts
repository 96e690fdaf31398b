import { readFileSync } from "node:fs";
import { parseCommandLine, USAGE, UsageError } from "./args.js";
import { ApiError, callAdmin } from "./client.js";
import { render } from "./format.js";

/** Where tollgatectl writes: answers to `out`, warnings and errors to `err`. */
export interface Io {
  out(text: string): void;
  err(text: string): void;
}

/** The admin API when neither --url nor TOLLGATE_ADMIN_URL names one (api-edge's ADMIN_PORT default). */
export const DEFAULT_ADMIN_URL = "http://127.0.0.1:8081";

function readToken(tokenFile: string | undefined, env: NodeJS.ProcessEnv): string {
  let token: string | undefined;
  if (tokenFile !== undefined) {
    try {
      token = readFileSync(tokenFile, "utf8");
    } catch (err) {
      throw new UsageError(`cannot read --token-file: ${(err as NodeJS.ErrnoException).code ?? "error"}`);
    }
  } else token = env["TOLLGATE_ADMIN_TOKEN"];
  token = token?.trim();
  if (!token) throw new UsageError("no admin token: set TOLLGATE_ADMIN_TOKEN or pass --token-file <path>");
  return token;
}

function baseUrl(flag: string | undefined, env: NodeJS.ProcessEnv): string {
  const url = flag ?? (env["TOLLGATE_ADMIN_URL"] || DEFAULT_ADMIN_URL);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new UsageError(`the admin URL '${url}' is not a URL`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new UsageError("the admin URL must be http:// or https://");
  }
  return url;
}

/**
 * Runs one tollgatectl command line and returns its exit code: 0 done, 1 the admin API refused
 * or could not be reached (its message is printed), 2 the command line is wrong.
 */
export async function run(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  io: Io,
  fetchImpl: typeof fetch = fetch,
): Promise<number> {
  try {
    const inv = parseCommandLine(argv);
    if (inv.kind === "help") {
      io.out(`${USAGE}\n`);
      return 0;
    }
    const url = baseUrl(inv.url, env);
    const token = readToken(inv.tokenFile, env);
    const body = await callAdmin(url, token, inv.request, fetchImpl);
    if (inv.json) {
      io.out(`${JSON.stringify(body, null, 2)}\n`);
      // Even in JSON the secret is shown once; the warning goes to stderr, off the JSON.
      if (inv.view === "key-created" || inv.view === "key-rotated") io.err(`${render(inv.view, body).err}\n`);
      return 0;
    }
    const shown = render(inv.view, body);
    io.out(`${shown.out}\n`);
    if (shown.err) io.err(`${shown.err}\n`);
    return 0;
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`tollgatectl: ${err.message}\nRun 'tollgatectl --help' for usage.\n`);
      return 2;
    }
    if (err instanceof ApiError) {
      const where = err.status > 0 ? ` (${err.code}, HTTP ${err.status})` : "";
      io.err(`tollgatectl: ${err.message}${where}\n`);
      return 1;
    }
    io.err(`tollgatectl: unexpected failure: ${(err as Error).message}\n`);
    return 1;
  }
}

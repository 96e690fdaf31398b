import pino, { type DestinationStream, type Logger } from "pino";

export type { Logger } from "pino";

/**
 * Paths that must never reach a log line: Virtual Keys, payment credentials, signatures,
 * wallet addresses, receipts, idempotency keys and prompt text (docs/contract.md, "Authentication", rule 4).
 * Code logs fixed messages with structured ids; this list is the second line of defence.
 */
export const REDACT_PATHS: readonly string[] = [
  "key",
  "*.key",
  "apiKey",
  "*.apiKey",
  "authorization",
  "*.authorization",
  "headers.authorization",
  "*.headers.authorization",
  'headers["payment-receipt"]',
  '*.headers["payment-receipt"]',
  'headers["idempotency-key"]',
  '*.headers["idempotency-key"]',
  "credential",
  "*.credential",
  "signature",
  "*.signature",
  "receipt",
  "*.receipt",
  "paymentReceipt",
  "*.paymentReceipt",
  "idempotencyKey",
  "*.idempotencyKey",
  "payer",
  "*.payer",
  "wallet",
  "*.wallet",
  "address",
  "*.address",
  "source",
  "*.source",
  "prompt",
  "*.prompt",
  "messages",
  "*.messages",
  "input",
  "*.input",
  "body",
  "*.body",
  "content",
  "*.content",
  "secret",
  "*.secret",
];

export interface LoggerOptions {
  service: string;
  version?: string;
  level?: string;
  /** Where lines go; stdout when omitted. Tests pass a capture stream. */
  destination?: DestinationStream;
}

/** Creates the process logger: JSON lines, `base: { service, version }`, redaction configured once. */
export function createLogger(opts: LoggerOptions): Logger {
  const logger = pino(
    {
      level: opts.level ?? "info",
      base: { service: opts.service, version: opts.version ?? "0.1.0" },
      redact: { paths: [...REDACT_PATHS], censor: "[redacted]" },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    opts.destination ?? bufferedStdout(),
  );
  skipRedactionOfPlainValues(logger);
  return logger;
}

/** Bytes of log lines gathered before one write to stdout. */
const LOG_BUFFER_BYTES = 4096;
/** The longest a line waits for its write when fewer than LOG_BUFFER_BYTES are pending. */
const LOG_FLUSH_MS = 100;

/** The start of an info, debug or trace line (the level is always a line's first field). */
const ROUTINE_LINE = /^\{"level":"(?:info|debug|trace)"/;

/** What sonic-boom 4 keeps of its state: bytes not yet written, and a write in flight. */
interface SonicState {
  _len?: number;
  _writing?: boolean;
}

/**
 * stdout, with info, debug and trace lines written in chunks of up to 4 KiB at least every
 * 100 ms, instead of one write per line through libuv's thread pool (a pool thread's wake-up
 * and a write per answered request on api-edge's path; docs/operations.md, "Logs"). A warning
 * or an error is written at once, with the lines before it (right after a write in flight, if
 * one is). Lines still pending are written synchronously when the process exits, normally or on
 * an uncaught error; a SIGKILL loses at most the last 100 ms of routine lines. An idle process
 * writes nothing (sonic-boom's own flush would write an empty chunk on every tick), and has no
 * timer of the logger's to wake it.
 */
function bufferedStdout(): DestinationStream {
  const dest = pino.destination({ sync: false, minLength: LOG_BUFFER_BYTES });
  const state = dest as unknown as SonicState;
  // Unknown internals (another sonic-boom): flush on every tick, as its own periodic flush does.
  const pending = () => (state._len ?? 1) > 0;
  // One timer, armed by the first line that waits and gone once nothing waits: an idle process
  // is never woken by its logger.
  let timer: NodeJS.Timeout | undefined;
  const later = () => {
    timer ??= setTimeout(() => {
      timer = undefined;
      if (!pending()) return;
      dest.flush();
      // A write in flight keeps what it has not taken yet: look again after the next interval.
      if (pending()) later();
    }, LOG_FLUSH_MS).unref();
  };
  dest.once("close", () => clearTimeout(timer));
  const urgent = () => {
    dest.flush();
    // A write already in flight leaves the rest buffered when it ends: write it then.
    if (state._writing) dest.once("drain", () => pending() && dest.flush());
  };
  return {
    write(line: string): boolean {
      const ok = dest.write(line);
      if (!ROUTINE_LINE.test(line)) urgent();
      if (pending()) later();
      return ok;
    },
    // logger.flush() (the shutdown's last step) reaches the file through these.
    flush: (cb?: (err?: Error) => void) => dest.flush(cb),
    flushSync: () => dest.flushSync(),
  } as DestinationStream;
}

type Stringifier = (value: unknown, stringifySafe?: unknown) => string;

/**
 * pino passes every top-level field that has no path of its own (`method`, `status`, `ms`, …)
 * through the redactor of the `*.<name>` paths, even a string or a number, where none of those
 * paths can match; with the list above that cost about 13 µs per line, most of the per-request
 * line's cost. This swaps in a redactor that writes a string, number or boolean as pino would
 * without redaction, and hands every other value (objects, arrays, errors, bigints) to pino's
 * redactor unchanged. Fields named by a top-level path (`key`, `body`, `headers`, …) keep their
 * own redactor. Child loggers inherit the swap. Left as is if pino's internals ever differ.
 */
function skipRedactionOfPlainValues(logger: Logger): void {
  const { stringifiersSym, wildcardFirstSym, stringifySym, stringifySafeSym } = pino.symbols;
  const target = logger as unknown as Record<symbol, unknown>;
  const stringifiers = target[stringifiersSym] as Record<string | symbol, Stringifier> | undefined;
  const wildcard = stringifiers?.[wildcardFirstSym];
  const stringify = target[stringifySym] as Stringifier | undefined;
  if (!stringifiers || typeof wildcard !== "function" || typeof stringify !== "function") return;
  const safe = target[stringifySafeSym];
  const swapped: Record<string | symbol, Stringifier> = Object.create(null);
  for (const k of Reflect.ownKeys(stringifiers)) swapped[k] = stringifiers[k]!;
  swapped[wildcardFirstSym] = (value, stringifySafe) => {
    const t = typeof value;
    return t === "string" || t === "number" || t === "boolean"
      ? stringify(value, stringifySafe ?? safe)
      : wildcard(value, stringifySafe);
  };
  target[stringifiersSym] = swapped;
}

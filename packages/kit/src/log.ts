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
    opts.destination ?? pino.destination({ sync: false }),
  );
  skipRedactionOfPlainValues(logger);
  return logger;
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

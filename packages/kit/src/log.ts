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
  return pino(
    {
      level: opts.level ?? "info",
      base: { service: opts.service, version: opts.version ?? "0.1.0" },
      redact: { paths: [...REDACT_PATHS], censor: "[redacted]" },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    opts.destination ?? pino.destination({ sync: false }),
  );
}

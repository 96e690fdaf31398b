import { Writable } from "node:stream";

/** Log lines captured in memory: pass `stream` as a pino destination, then assert on the lines. */
export interface LogCapture {
  /** A Writable with a synchronous write(string); pino accepts it as its destination. */
  stream: Writable;
  /** Every non-empty line written so far. */
  lines(): string[];
  /** Every line parsed as JSON; lines that are not JSON are skipped. */
  records(): Record<string, unknown>[];
  /** Everything written so far, verbatim. */
  text(): string;
  /** Forgets what was written. */
  clear(): void;
}

/** Captures every chunk written to its stream, for asserting on log output in tests. */
export function captureLogs(): LogCapture {
  let chunks: string[] = [];
  const stream = new Writable({
    decodeStrings: false,
    write(chunk: string | Buffer, _encoding, callback) {
      chunks.push(typeof chunk === "string" ? chunk : chunk.toString("utf8"));
      callback();
    },
  });
  const text = () => chunks.join("");
  const lines = () =>
    text()
      .split("\n")
      .filter((l) => l !== "");
  return {
    stream,
    text,
    lines,
    records() {
      const out: Record<string, unknown>[] = [];
      for (const line of lines()) {
        try {
          const value: unknown = JSON.parse(line);
          if (value && typeof value === "object" && !Array.isArray(value))
            out.push(value as Record<string, unknown>);
        } catch {
          // not a JSON line
        }
      }
      return out;
    },
    clear() {
      chunks = [];
    },
  };
}

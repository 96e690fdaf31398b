import { InferenceError } from "../../domain/errors.js";
import type { ProviderChunk } from "../../domain/ports.js";

// Helpers of the provider tests (no test runner imported here).

/** Every chunk of a stream, pushed to `out` as they come (so a failed stream leaves what it gave). */
export async function drain(
  chunks: AsyncIterable<ProviderChunk>,
  out: ProviderChunk[] = [],
): Promise<ProviderChunk[]> {
  for await (const c of chunks) out.push(c);
  return out;
}

/** The InferenceError `p` rejects with; any other outcome throws. */
export async function failure(p: Promise<unknown>): Promise<InferenceError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof InferenceError) return err;
    throw err;
  }
  throw new Error("expected a rejection");
}

import { startFakeUpstream } from "../fake-upstream.js";

// A stand-alone fake upstream for local stacks and the benchmark:
//   PORT=18000 FAKE_TTFT_MS=50 tsx packages/demo/src/bin/fake-upstream.ts

function numberFrom(name: string, fallback: number | undefined): number | undefined {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0) {
    console.error(`${name} must be a non-negative number, got ${JSON.stringify(raw)}`);
    process.exit(1);
  }
  return value;
}

const host = process.env["HOST"] || "127.0.0.1";
const upstream = await startFakeUpstream({
  host,
  port: numberFrom("PORT", 18000),
  latencyMs: numberFrom("FAKE_LATENCY_MS", 0),
  ttftMs: numberFrom("FAKE_TTFT_MS", 0),
  tokensPerSecond: numberFrom("FAKE_TOKENS_PER_SECOND", 0),
  outputTokens: numberFrom("FAKE_OUTPUT_TOKENS", undefined),
  apiKey: process.env["FAKE_API_KEY"] || undefined,
  firstByteDelayMs: numberFrom("FAKE_FIRST_BYTE_DELAY_MS", 0),
  // FAKE_FAIL_STATUS=500 (optionally FAKE_RETRY_AFTER=2) makes every completion fail; FAKE_HANG=1 never answers.
  ...failureFromEnv(),
});

function failureFromEnv() {
  const status = numberFrom("FAKE_FAIL_STATUS", undefined);
  const retryAfter = process.env["FAKE_RETRY_AFTER"] || undefined;
  if (process.env["FAKE_HANG"] === "1") return { failure: { hang: true } };
  if (status === undefined) return {};
  return { failure: { status, ...(retryAfter ? { retryAfter } : {}) } };
}
console.log(`fake upstream listening on ${upstream.url}`);

let stopping = false;
const stop = () => {
  if (stopping) return;
  stopping = true;
  upstream.close().then(
    () => process.exit(0),
    () => process.exit(1),
  );
};
process.once("SIGTERM", stop);
process.once("SIGINT", stop);

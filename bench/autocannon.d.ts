// The part of autocannon's programmatic API the benchmark uses (autocannon ships no types).
declare module "autocannon" {
  import type { EventEmitter } from "node:events";

  interface Options {
    url: string;
    method?: string;
    body?: string | Buffer;
    headers?: Record<string, string>;
    connections?: number;
    /** Seconds. */
    duration?: number;
    pipelining?: number;
    /** Seconds before a request counts as a timeout. */
    timeout?: number;
  }

  interface Result {
    /** Seconds the run lasted. */
    duration: number;
    errors: number;
    timeouts: number;
    non2xx: number;
    requests: { total: number; average: number };
    statusCodeStats: Record<string, { count: number }>;
  }

  /** Emits `response` (client, statusCode, bytes, responseTimeMs) for every answer; awaitable. */
  interface Instance extends EventEmitter, PromiseLike<Result> {
    stop(): void;
  }

  function autocannon(opts: Options): Instance;
  export default autocannon;
}

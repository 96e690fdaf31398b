import { describe } from "vitest";
import { rateLimiterContract } from "../../test/rate-limiter-contract.js";
import { createMemoryRateLimiter } from "./memory-rate-limiter.js";

describe("memory rate limiter", () => {
  rateLimiterContract(() => createMemoryRateLimiter());
});

import { describe, expect, it } from "vitest";
import { isRedisUnavailable } from "./redis.js";

describe("isRedisUnavailable", () => {
  it("recognises the errors of an unreachable or restarting Redis", () => {
    for (const message of [
      "Stream isn't writeable and enableOfflineQueue options is false",
      "Connection is closed.",
      'Reached the max retries per request limit (which is 0). Refer to "maxRetriesPerRequest" option for details.',
      "LOADING Redis is loading the dataset in memory",
      "connect ECONNREFUSED 127.0.0.1:6379",
      "read ECONNRESET",
    ])
      expect(isRedisUnavailable(new Error(message)), message).toBe(true);
  });

  it("leaves command errors and non-errors alone", () => {
    expect(isRedisUnavailable(new Error("ERR wrong number of arguments for 'hget' command"))).toBe(false);
    expect(isRedisUnavailable(new Error("reservation budgets changed"))).toBe(false);
    expect(isRedisUnavailable("Connection is closed.")).toBe(false);
    expect(isRedisUnavailable(undefined)).toBe(false);
  });
});

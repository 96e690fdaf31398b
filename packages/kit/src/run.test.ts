import { describe, expect, it } from "vitest";
import { ConfigError } from "./config.js";
import { oneLine } from "./run.js";

describe("oneLine", () => {
  it("puts every configuration problem on one line", () => {
    expect(oneLine(new ConfigError(["LOG_LEVEL: invalid", "GRPC_PORT: not a number"]))).toBe(
      "invalid configuration: LOG_LEVEL: invalid; GRPC_PORT: not a number",
    );
  });

  it("keeps only the first line of any other error", () => {
    expect(oneLine(new Error("Authorization Violation\n  detail"))).toBe("Authorization Violation");
  });
});

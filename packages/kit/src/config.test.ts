import { describe, expect, it } from "vitest";
import { z } from "zod";
import {
  ConfigError,
  describeIssues,
  logLevel,
  parseEnv,
  port,
  shownServers,
  shutdownTimeoutSeconds,
} from "./config.js";
import { natsAddress } from "./nats.js";
import { redisAddress } from "./redis.js";

const schema = z.object({
  GRPC_HOST: z.string().default("0.0.0.0"),
  GRPC_PORT: port(50051),
  HTTP_PORT: port(8080),
  NATS_URL: z.url(),
  LOG_LEVEL: logLevel,
});

function failure(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return err as ConfigError;
  }
  throw new Error("expected a ConfigError");
}

describe("parseEnv", () => {
  it("names every bad variable in one error", () => {
    const err = failure(() => parseEnv(schema, { GRPC_PORT: "not-a-port", HTTP_PORT: "70000" }));
    expect(err.problems).toHaveLength(3);
    const text = err.problems.join("\n");
    expect(text).toContain("GRPC_PORT");
    expect(text).toContain("HTTP_PORT");
    expect(text).toContain("NATS_URL");
    // The message lists them too, so a crash log shows everything to fix.
    expect(err.message).toContain("GRPC_PORT");
    expect(err.message).toContain("HTTP_PORT");
    expect(err.message).toContain("NATS_URL");
  });

  it("treats empty strings as unset so defaults apply", () => {
    const cfg = parseEnv(schema, {
      GRPC_HOST: "",
      GRPC_PORT: "",
      HTTP_PORT: "",
      LOG_LEVEL: "",
      NATS_URL: "nats://127.0.0.1:4222",
    });
    expect(cfg).toEqual({
      GRPC_HOST: "0.0.0.0",
      GRPC_PORT: 50051,
      HTTP_PORT: 8080,
      LOG_LEVEL: "info",
      NATS_URL: "nats://127.0.0.1:4222",
    });
  });

  it("reports an empty required variable as missing", () => {
    const err = failure(() => parseEnv(schema, { NATS_URL: "" }));
    expect(err.problems.join("\n")).toContain("NATS_URL");
  });

  it("coerces ports to numbers and accepts 0 and 65535", () => {
    const cfg = parseEnv(schema, { GRPC_PORT: "0", HTTP_PORT: "65535", NATS_URL: "nats://n:4222" });
    expect(cfg.GRPC_PORT).toBe(0);
    expect(cfg.HTTP_PORT).toBe(65535);
  });

  it("refuses fractional and negative ports", () => {
    const err = failure(() => parseEnv(schema, { GRPC_PORT: "80.5", HTTP_PORT: "-1", NATS_URL: "nats://n" }));
    const text = err.problems.join("\n");
    expect(text).toContain("GRPC_PORT");
    expect(text).toContain("HTTP_PORT");
  });

  it("refuses an unknown log level", () => {
    const err = failure(() => parseEnv(schema, { LOG_LEVEL: "verbose", NATS_URL: "nats://n" }));
    expect(err.problems.join("\n")).toContain("LOG_LEVEL");
  });

  it("ignores variables the schema does not name", () => {
    const cfg = parseEnv(schema, { NATS_URL: "nats://n:4222", PATH: "/usr/bin", HOME: "/root" });
    expect(cfg).not.toHaveProperty("PATH");
  });
});

describe("SHUTDOWN_TIMEOUT_SECONDS", () => {
  const bound = z.object({ SHUTDOWN_TIMEOUT_SECONDS: shutdownTimeoutSeconds });

  it("is 25 s when unset, and whole seconds from 1 to an hour when set", () => {
    expect(parseEnv(bound, {}).SHUTDOWN_TIMEOUT_SECONDS).toBe(25);
    expect(parseEnv(bound, { SHUTDOWN_TIMEOUT_SECONDS: "125" }).SHUTDOWN_TIMEOUT_SECONDS).toBe(125);
    for (const bad of ["0", "1.5", "-3", "3601", "soon"]) {
      const err = failure(() => parseEnv(bound, { SHUTDOWN_TIMEOUT_SECONDS: bad }));
      expect(err.message, bad).toContain("SHUTDOWN_TIMEOUT_SECONDS");
    }
  });
});

describe("describeIssues", () => {
  it("prefixes each problem with its source and path", () => {
    const result = z.object({ a: z.object({ b: z.number() }) }).safeParse({ a: { b: "x" } });
    expect(result.success).toBe(false);
    const [line] = describeIssues(result.error?.issues ?? [], "tollgate.yaml");
    expect(line).toMatch(/^tollgate\.yaml\.a\.b: /);
  });

  it("names the root when the problem has no path", () => {
    const result = z.number().safeParse("x");
    const [line] = describeIssues(result.error?.issues ?? []);
    expect(line).toMatch(/^\(root\): /);
  });
});

describe("shownServers: a Redis or NATS address as a log line shows it", () => {
  it("never shows a password, a token or a query, whatever characters they hold", () => {
    const urls = [
      "redis://:pw@SECRET@127.0.0.1:6390",
      "redis://127.0.0.1:6390/0?password=SECRET",
      "rediss://u:p/SECRET@127.0.0.1:6390",
      "redis+cluster://u:SECRET@a:7000,b:7001",
      "nats://u:pw@SECRET@127.0.0.1:4290",
      "nats://tok/SECRET@127.0.0.1:4290",
      "nats://SECRET@n-0:4222,n-1:4222",
      "nats://u:pw,SECRET@n-0:4222",
    ];
    for (const url of urls) {
      for (const shown of [
        shownServers(url),
        shownServers(url, { scheme: true }),
        natsAddress(url),
        redisAddress(url),
      ]) {
        expect(shown).not.toContain("SECRET");
        expect(shown).not.toContain("pw");
      }
    }
  });

  it("shows each server's host and port, with its scheme when asked", () => {
    expect(shownServers("nats://u:pw@SECRET@n-0:4222,n-1:4222", { scheme: true })).toBe(
      "nats://n-0:4222,n-1:4222",
    );
    expect(natsAddress("nats://u:pw@SECRET@n-0:4222")).toBe("n-0:4222");
    expect(redisAddress("rediss://:pw@redis")).toBe("redis:6379");
    expect(redisAddress("redis+cluster://u:pw@a:7000,b:7001")).toBe("a:7000,b:7001");
    expect(shownServers("nats://tok/SECRET@127.0.0.1:4290")).toBe("?");
  });
});

import { ConfigError } from "@tollgate/kit/config";
import { describe, expect, it } from "vitest";
import { describeStartupError } from "./banner.js";
import { loadConfig } from "./config.js";

/** The error Node gives a listen on a taken address. */
const taken = (port: number, address = "127.0.0.1") =>
  Object.assign(new Error(`listen EADDRINUSE: address already in use ${address}:${port}`), {
    code: "EADDRINUSE",
    syscall: "listen",
    address,
    port,
  });

describe("describeStartupError", () => {
  const cfg = loadConfig({ PORT: "8080", METRICS_PORT: "9090", TEMPO_DEVNET_PORT: "18545" });

  it("names the variable of whichever port is taken", () => {
    expect(describeStartupError(taken(9090), cfg)).toContain("set METRICS_PORT to a free port");
    expect(describeStartupError(taken(18545), cfg)).toContain("set TEMPO_DEVNET_PORT to a free port");
    expect(describeStartupError(taken(8080, "::1"), cfg)).toContain("cannot listen on [::1]:8080");
  });

  it("says when two variables name the same port", () => {
    const same = loadConfig({ PORT: "9000", METRICS_PORT: "9000" });
    expect(describeStartupError(taken(9000), same)).toContain(
      "PORT and METRICS_PORT name the same port, give each its own",
    );
  });

  it("lists configuration problems once, and keeps other messages without a stack", () => {
    const text = describeStartupError(new ConfigError(["a: bad", "b: worse"]), cfg);
    expect(text).toBe("tollgate: invalid configuration:\n  - a: bad\n  - b: worse");
    expect(describeStartupError(new Error("boom"), cfg)).toBe("tollgate: could not start: boom");
  });
});

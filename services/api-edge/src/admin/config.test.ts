import { ConfigError } from "@tollgate/kit/config";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../config.js";

describe("api-edge config: the admin API", () => {
  it("stays off without ADMIN_TOKEN, and with an empty one", () => {
    expect(loadConfig({}).admin).toBeUndefined();
    expect(loadConfig({ ADMIN_TOKEN: "", ADMIN_PORT: "9999" }).admin).toBeUndefined();
  });

  it("runs on 127.0.0.1:8081 against metering on 127.0.0.1:50054 by default", () => {
    expect(loadConfig({ ADMIN_TOKEN: "0123456789abcdef" }).admin).toEqual({
      host: "127.0.0.1",
      port: 8081,
      token: "0123456789abcdef",
      meteringAddr: "127.0.0.1:50054",
    });
    expect(
      loadConfig({
        ADMIN_TOKEN: "0123456789abcdef",
        ADMIN_HOST: "0.0.0.0",
        ADMIN_PORT: "9091",
        METERING_ADDR: "metering:50054",
      }).admin,
    ).toEqual({ host: "0.0.0.0", port: 9091, token: "0123456789abcdef", meteringAddr: "metering:50054" });
  });

  it("refuses a short token without printing it", () => {
    let error: unknown;
    try {
      loadConfig({ ADMIN_TOKEN: "short-secret" });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as Error).message).toContain("ADMIN_TOKEN");
    expect((error as Error).message).not.toContain("short-secret");
  });
});

import { createLogger } from "@tollgate/kit/log";
import { freePort } from "@tollgate/testkit/fixtures";
import { afterEach, describe, expect, it } from "vitest";
import { type ApiEdge, start } from "../../src/app.js";
import { loadConfig } from "../../src/config.js";

const log = createLogger({ service: "api-edge", level: "silent" });
const TOKEN = "admin-token-0123456789abcdef";
let edge: ApiEdge | undefined;

afterEach(async () => {
  await edge?.stop();
  edge = undefined;
});

/** api-edge as main.ts starts it; nothing behind it answers, which these checks never need. */
async function startEdge(env: NodeJS.ProcessEnv) {
  const config = loadConfig({
    HOST: "127.0.0.1",
    PORT: "0",
    AUTH_POLICY_ADDR: "127.0.0.1:1",
    INFERENCE_ROUTER_ADDR: "127.0.0.1:1",
    MPP_PAYMENT_ADDR: "off",
    METERING_ADDR: "127.0.0.1:1",
    METRICS_PORT: "0",
    // Nothing behind this edge answers: no internal credentials to present.
    INTERNAL_AUTH: "off",
    ...env,
  });
  edge = await start(config, log);
  return edge;
}

const get = (url: string, token?: string) =>
  fetch(url, token ? { headers: { authorization: `Bearer ${token}` } } : {}).then((r) => r.status);

describe("api-edge admin port", () => {
  it("does not start without ADMIN_TOKEN: nothing listens on ADMIN_PORT, the public port has no admin route", async () => {
    const adminPort = await freePort();
    const e = await startEdge({ ADMIN_PORT: String(adminPort) });
    expect(e.adminPort).toBeUndefined();
    await expect(fetch(`http://127.0.0.1:${adminPort}/admin/v1/usage`)).rejects.toThrow();
    expect(await get(`http://127.0.0.1:${e.port}/admin/v1/usage`, TOKEN)).toBe(404);
  });

  it("with ADMIN_TOKEN listens on ADMIN_PORT apart from the public port, and stops with the edge", async () => {
    const adminPort = await freePort();
    const e = await startEdge({ ADMIN_PORT: String(adminPort), ADMIN_TOKEN: TOKEN });
    expect(e.adminPort).toBe(adminPort);
    expect(await get(`http://127.0.0.1:${adminPort}/admin/v1/accounts/a/keys`)).toBe(401);
    expect(await get(`http://127.0.0.1:${adminPort}/admin/v1/accounts/a/keys`, "wrong")).toBe(401);
    // Authenticated, but auth-policy is not there: a retryable 503 that names no address.
    const res = await fetch(`http://127.0.0.1:${adminPort}/admin/v1/accounts/a/keys`, {
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    expect(res.status).toBe(503);
    expect(await res.text()).not.toContain("127.0.0.1:1");
    expect(await get(`http://127.0.0.1:${e.port}/admin/v1/accounts/a/keys`, TOKEN)).toBe(404);
    await e.stop();
    edge = undefined;
    await expect(fetch(`http://127.0.0.1:${adminPort}/admin/v1/usage`)).rejects.toThrow();
  });
});

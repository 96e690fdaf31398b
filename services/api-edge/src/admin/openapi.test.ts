import { createLogger } from "@tollgate/kit/log";
import { describe, expect, it } from "vitest";
import { registeredRoutes } from "../openapi/registered-routes.js";
import { adminDocument } from "./openapi.js";
import { type AdminAuthClient, type AdminMeteringClient, buildAdminApp } from "./server.js";

const TOKEN = "admin-token-0123456789";

function adminApp() {
  const never = async () => {
    throw new Error("not called");
  };
  return buildAdminApp({
    token: TOKEN,
    auth: new Proxy({}, { get: () => never }) as AdminAuthClient,
    metering: { getUsage: never } as unknown as AdminMeteringClient,
    log: createLogger({ service: "api-edge", level: "silent" }),
  });
}

describe("the admin API's OpenAPI document", () => {
  it("documents exactly the routes the admin server registers", async () => {
    const app = adminApp();
    await app.ready();
    const registered = registeredRoutes(app)
      .map((r) => `${r.method} ${r.path}`)
      .sort();
    expect(registered.length).toBeGreaterThan(10);
    const documented = Object.entries(adminDocument().paths)
      .flatMap(([path, item]) => Object.keys(item).map((m) => `${m.toUpperCase()} ${path}`))
      .sort();
    expect(documented).toEqual(registered);
    await app.close();
  });

  it("is served at GET /admin/v1/openapi.json behind the admin token", async () => {
    const app = adminApp();
    const refused = await app.inject({ method: "GET", url: "/admin/v1/openapi.json" });
    expect(refused.statusCode).toBe(401);
    const res = await app.inject({
      method: "GET",
      url: "/admin/v1/openapi.json",
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    expect(res.statusCode).toBe(200);
    expect(res.headers["cache-control"]).toBe("no-store");
    expect(res.json()).toEqual(JSON.parse(JSON.stringify(adminDocument())));
    await app.close();
  });
});

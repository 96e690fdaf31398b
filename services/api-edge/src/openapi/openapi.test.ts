import { readFileSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import { Validator } from "@seriousme/openapi-schema-validator";
import { loadGatewayConfig } from "@tollgate/config";
import { createLogger } from "@tollgate/kit/log";
import { createMetrics } from "@tollgate/kit/metrics";
import { OPERATION_NAMES, ROUTE_IDS, ROUTES, type RouteSpec } from "@tollgate/proto/routes";
import type { FastifyInstance } from "fastify";
import { describe, expect, it } from "vitest";
import { createMemoryIdempotencyStore } from "../adapters/memory-idempotency-store.js";
import { adminDocument } from "../admin/openapi.js";
import { type ApiEdgePorts, buildApp } from "../app.js";
import type { AuthClient, InferenceClient, PaymentClient } from "../routes/context.js";
import { committedDocuments, DEMO_CONFIG } from "./committed.js";
import { errorCodes, type OpenApiDocument, openApiPath } from "./document.js";
import type { PaymentInfo } from "./payment-info.js";
import { publicDocument } from "./public.js";
import { registeredRoutes } from "./registered-routes.js";

const demo = loadGatewayConfig(DEMO_CONFIG.pathname);
const HTTP_METHODS = ["get", "post", "put", "patch", "delete"];

/** "GET /v1/models/{model}" for every operation of a document. */
function operations(doc: OpenApiDocument): string[] {
  return Object.entries(doc.paths)
    .flatMap(([path, item]) =>
      Object.keys(item)
        .filter((m) => HTTP_METHODS.includes(m))
        .map((m) => `${m.toUpperCase()} ${path}`),
    )
    .sort();
}

/** The public port with ports that must never be reached by GET /openapi.json. */
function edge(opts: { payment: boolean; maxMessages?: number }) {
  const calls: string[] = [];
  const refuse = (name: string) => async () => {
    calls.push(name);
    throw new Error(`${name} called`);
  };
  const ports: ApiEdgePorts = {
    auth: { authorize: refuse("authorize"), settleReservation: refuse("settle") } as unknown as AuthClient,
    inference: { complete: refuse("complete") } as unknown as InferenceClient,
    ...(opts.payment
      ? { payment: { challenge: refuse("challenge") } as unknown as PaymentClient, offer: demo }
      : {}),
    idempotencyStore: createMemoryIdempotencyStore(),
    log: createLogger({ service: "api-edge", level: "silent" }),
    metrics: createMetrics("api-edge"),
  };
  const { app } = buildApp(ports, opts.maxMessages ? { maxMessages: opts.maxMessages } : {});
  return { app, calls };
}

async function served(app: FastifyInstance): Promise<OpenApiDocument> {
  const res = await app.inject({ method: "GET", url: "/openapi.json" });
  expect(res.statusCode).toBe(200);
  expect(res.headers["content-type"]).toMatch(/^application\/json/);
  return res.json() as OpenApiDocument;
}

describe("GET /openapi.json on the public port", () => {
  it("answers the document without a key, calling no service behind the edge (nothing billed or limited)", async () => {
    const { app, calls } = edge({ payment: true });
    const doc = await served(app);
    expect(doc.openapi).toBe("3.1.0");
    await served(app);
    expect(calls).toEqual([]);
    // The same bytes gzipped to a client that takes gzip; a bodiless 304 to one that has them.
    const plain = await app.inject({ method: "GET", url: "/openapi.json" });
    const gz = await app.inject({
      method: "GET",
      url: "/openapi.json",
      headers: { "accept-encoding": "gzip" },
    });
    expect(gz.headers["content-encoding"]).toBe("gzip");
    expect(gunzipSync(gz.rawPayload).equals(plain.rawPayload)).toBe(true);
    expect(gz.rawPayload.length).toBeLessThan(plain.rawPayload.length / 3);
    const etag = String(plain.headers["etag"]);
    const again = await app.inject({
      method: "GET",
      url: "/openapi.json",
      headers: { "if-none-match": etag },
    });
    expect([again.statusCode, again.body]).toEqual([304, ""]);
    expect(calls).toEqual([]);
    const post = await app.inject({ method: "POST", url: "/openapi.json" });
    expect(post.statusCode).toBe(405);
    expect(post.headers["allow"]).toBe("GET, HEAD");
    await app.close();
  });

  it("documents exactly the routes the app registers, with and without the paid door", async () => {
    for (const payment of [true, false]) {
      const { app } = edge({ payment });
      const doc = await served(app);
      const registered = registeredRoutes(app);
      // Every path the app routes has an operation, and every operation a route.
      expect(Object.keys(doc.paths).sort()).toEqual([...new Set(registered.map((r) => r.path))].sort());
      const table = ROUTE_IDS.map((id) => ROUTES[id] as RouteSpec)
        .filter((s) => app.hasRoute({ method: s.method, url: s.path }))
        .map((s) => `${s.method} ${openApiPath(s.path)}`)
        .sort();
      expect(operations(doc)).toEqual(table);
      expect(table.includes("POST /v1/mpp/chat/completions")).toBe(payment);
      await app.close();
    }
  });

  it("carries the configured message limit in the request schemas", async () => {
    const { app } = edge({ payment: false, maxMessages: 7 });
    const doc = await served(app);
    const body = doc.paths["/v1/chat/completions"]?.post?.requestBody as {
      content: { "application/json": { schema: { properties: { messages: { maxItems: number } } } } };
    };
    expect(body.content["application/json"].schema.properties.messages.maxItems).toBe(7);
    await app.close();
  });

  it("gives the paid operation x-payment-info with every configured plan's models and prices", async () => {
    const { app } = edge({ payment: true });
    const op = (await served(app)).paths["/v1/mpp/chat/completions"]?.post;
    const info = op?.["x-payment-info"] as PaymentInfo;
    expect(info).toMatchObject({ intent: "session", method: "tempo", amount: null });
    // The quote's rule as docs/money.md, "The quote" gives it: the output cap for every sequence.
    expect(info.description).toMatch(
      /output cap, once for every output sequence it asks for \(the larger of `n` and `best_of`\)/,
    );
    expect(Object.keys(op?.responses ?? {})).toContain("402");
    const prices = new Map(demo.models.map((m) => [m.id, m]));
    expect(info.plans.map((p) => p.name)).toEqual(Object.keys(demo.plans ?? {}));
    for (const plan of info.plans) {
      const configured = demo.plans?.[plan.name as keyof NonNullable<typeof demo.plans>];
      expect(plan.default_model).toBe(configured?.default);
      expect(plan.models.map((m) => m.id)).toEqual(configured?.models);
      for (const m of plan.models) {
        expect(BigInt(m.input_per_million)).toBe(prices.get(m.id)?.pricing.inputPerMillion);
        expect(BigInt(m.output_per_million)).toBe(prices.get(m.id)?.pricing.outputPerMillion);
      }
    }
    await app.close();
  });
});

describe("the OpenAPI documents", () => {
  const pub = publicDocument({ routes: ROUTE_IDS, maxMessages: 2048, offer: demo });
  const admin = adminDocument();

  it("are valid OpenAPI 3.1 documents", async () => {
    for (const doc of [pub, admin]) {
      const result = await new Validator().validate(
        structuredClone(doc) as unknown as Record<string, unknown>,
      );
      expect(result.errors ?? [], doc.info.title).toEqual([]);
      expect(result.valid).toBe(true);
    }
  });

  it("every $ref points at a component that exists", () => {
    for (const doc of [pub, admin]) {
      const refs = [...JSON.stringify(doc).matchAll(/"\$ref":"#\/components\/(\w+)\/(\w+)"/g)];
      expect(refs.length).toBeGreaterThan(5);
      for (const [ref, kind, name] of refs) {
        const group = (doc.components as unknown as Record<string, Record<string, unknown>>)[kind!];
        expect(group?.[name!], ref).toBeDefined();
      }
    }
  });

  it("name the error codes of their doors, and the admin's route names are the operations", () => {
    expect(pub.components.schemas["ErrorCode"]?.["enum"]).toEqual(errorCodes(["account", "paid"]));
    const adminError = admin.components.schemas["Error"] as {
      properties: { error: { properties: { code: { enum: string[] } } } };
    };
    expect(adminError.properties.error.properties.code.enum).toEqual(errorCodes(["admin"]));
    expect(admin.components.schemas["RouteName"]?.["enum"]).toEqual([...OPERATION_NAMES]);
  });

  it("are committed as the generator writes them (npm run openapi)", () => {
    for (const { file, text } of committedDocuments()) {
      expect(readFileSync(file, "utf8"), `${file.pathname} is stale: run npm run openapi`).toBe(text);
    }
  });
});

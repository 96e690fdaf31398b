// GET /openapi.json of the all-in-one gateway: the document is built from the running
// configuration (a price changed in the file shows in x-payment-info), an MPP discovery
// validator accepts it, and a sample body of every request schema it describes is accepted by
// its route (and one it refuses is refused by the route).

import { readFileSync } from "node:fs";
import { DEMO_CONFIG } from "@tollgate/testkit/stack";
import { Ajv2020 } from "ajv/dist/2020.js";
import { validate as validateDiscovery } from "mppx/discovery";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Books } from "./books.js";
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";

const DEMO_KEY = /secret: (tg_\S+)/.exec(readFileSync(DEMO_CONFIG, "utf8"))![1]!;

const BUDGET = 50_000_000n;

/**
 * The demo configuration, its upstream the test's fake, one price changed (not the committed
 * one), and the demo connection's budget turned on so the books can be checked.
 */
const config = (upstreamUrl: string) =>
  readFileSync(DEMO_CONFIG, "utf8")
    .replace("http://127.0.0.1:18000/v1", upstreamUrl)
    .replace("# budget: { amount: 50000000, period: month }", `budget: { amount: ${BUDGET}, period: month }`)
    .replace(
      "pricing: { inputPerMillion: 150000, outputPerMillion: 600000 }",
      "pricing: { inputPerMillion: 150001, outputPerMillion: 600003 }",
    );

interface Doc {
  paths: Record<
    string,
    Record<
      string,
      {
        requestBody?: { content: { "application/json": { schema: object } } };
        "x-payment-info"?: {
          intent: string;
          method: string;
          amount: null;
          plans: {
            name: string;
            default_model: string;
            models: { id: string; input_per_million: string; output_per_million: string }[];
          }[];
        };
      }
    >
  >;
}

const hi = [{ role: "user", content: "Hi" }];

/** One body per POST route that takes one, and the status its route answers it with. */
const SAMPLES: Record<string, { body: unknown; status: number }> = {
  "/v1/chat/completions": { body: { model: "tollgate-mini", messages: hi, max_tokens: 8 }, status: 200 },
  "/v1/completions": { body: { model: "tollgate-mini", prompt: "Hi", max_tokens: 8 }, status: 200 },
  "/v1/responses": { body: { model: "tollgate-mini", input: "Hi", max_output_tokens: 8 }, status: 200 },
  "/v1/messages": { body: { model: "tollgate-mini", messages: hi, max_tokens: 8 }, status: 200 },
  "/v1/think": { body: { model: "tollgate-reasoner", prompt: "Hi", max_output_tokens: 16 }, status: 200 },
  "/v1/embeddings": { body: { model: "tollgate-embed-mini", input: "Hi" }, status: 200 },
  // Unpaid: the route prices it and answers 402 with a challenge.
  "/v1/mpp/chat/completions": {
    body: { plan: "Starter", model_optimization: true, messages: hi, max_tokens: 8 },
    status: 402,
  },
};

let gateway: ConfiguredGateway;
let books: Books;
let url: string;
let doc: Doc;

beforeAll(async () => {
  gateway = await startConfiguredGateway(config);
  books = new Books(gateway.gateway, { id: "demo", key: DEMO_KEY, budget: BUDGET });
  url = gateway.gateway.url;
  const res = await fetch(`${url}/openapi.json`);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toMatch(/^application\/json/);
  doc = (await res.json()) as Doc;
});
afterAll(async () => {
  books?.close();
  await gateway?.stop();
});

const post = (path: string, body: unknown) =>
  fetch(`${url}${path}`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      // The paid door takes no key; the Messages route takes it as Anthropic's SDKs send it.
      ...(path.startsWith("/v1/mpp/")
        ? {}
        : path === "/v1/messages"
          ? { "x-api-key": DEMO_KEY }
          : { authorization: `Bearer ${DEMO_KEY}` }),
    },
    body: JSON.stringify(body),
  });

describe("GET /openapi.json of the all-in-one gateway", () => {
  it("passes mppx's discovery validation, the paid operation priced from the running configuration", () => {
    expect(validateDiscovery(doc)).toEqual([]);
    const info = doc.paths["/v1/mpp/chat/completions"]?.["post"]?.["x-payment-info"];
    expect(info).toMatchObject({ intent: "session", method: "tempo", amount: null });
    const configured = gateway.gateway.gateway;
    expect(info?.plans.map((p) => p.name)).toEqual(Object.keys(configured.plans ?? {}));
    for (const plan of info?.plans ?? []) {
      for (const m of plan.models) {
        const pricing = configured.models.find((c) => c.id === m.id)?.pricing;
        expect([m.input_per_million, m.output_per_million]).toEqual([
          String(pricing?.inputPerMillion),
          String(pricing?.outputPerMillion),
        ]);
      }
    }
    const mini = info?.plans[0]?.models.find((m) => m.id === "tollgate-mini");
    expect([mini?.input_per_million, mini?.output_per_million]).toEqual(["150001", "600003"]);
  });

  it("describes request bodies its routes accept, and refuses what the routes refuse", async () => {
    const ajv = new Ajv2020({ strict: false });
    const posts = Object.entries(doc.paths).filter(([, item]) => item["post"]?.requestBody);
    expect(posts.map(([path]) => path).sort()).toEqual(Object.keys(SAMPLES).sort());
    for (const [path, item] of posts) {
      const check = ajv.compile(item["post"]!.requestBody!.content["application/json"].schema);
      const sample = SAMPLES[path]!;
      expect(check(sample.body), `${path}: ${JSON.stringify(check.errors)}`).toBe(true);
      const res = await post(path, sample.body);
      expect(res.status, `${path}: ${await res.clone().text()}`).toBe(sample.status);
      if (res.status === 200) books.tell(BigInt(res.headers.get("x-tollgate-cost") ?? "-1"));
      await res.arrayBuffer();
    }
    // A field the embeddings schema does not name: the document and the route both refuse it.
    const extra = { model: "tollgate-embed-mini", input: "Hi", temperature: 1 };
    const embeddings = doc.paths["/v1/embeddings"]!["post"]!.requestBody!.content["application/json"].schema;
    expect(ajv.compile(embeddings)(extra)).toBe(false);
    const refused = await post("/v1/embeddings", extra);
    expect(refused.status).toBe(400);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("invalid_request");
    // Told cost == metered == the budget's loss, no hold left; the refused and unpaid ones cost nothing.
    await books.check();
  });
});

describe("GET /openapi.json with a subset of the plans, or none", () => {
  const PLANS = /^plans:\n(?: {2}.*\n)+/m;
  const withPlans = (plans: string) => (upstreamUrl: string) =>
    readFileSync(DEMO_CONFIG, "utf8").replace("http://127.0.0.1:18000/v1", upstreamUrl).replace(PLANS, plans);

  const served = async (g: ConfiguredGateway) =>
    (await (await fetch(`${g.gateway.url}/openapi.json`)).json()) as Doc;

  it("lists only the plans the running configuration offers, and no paid operation without any", async () => {
    const starter = await startConfiguredGateway(
      withPlans("plans:\n  Starter: { models: [tollgate-mini], default: tollgate-mini }\n"),
    );
    try {
      const info = (await served(starter)).paths["/v1/mpp/chat/completions"]?.["post"]?.["x-payment-info"];
      expect(info?.plans.map((p) => [p.name, p.default_model, p.models.map((m) => m.id)])).toEqual([
        ["Starter", "tollgate-mini", ["tollgate-mini"]],
      ]);
    } finally {
      await starter.stop();
    }
    const none = await startConfiguredGateway(withPlans(""));
    try {
      const doc = await served(none);
      expect(doc.paths["/v1/mpp/chat/completions"]).toBeUndefined();
      expect(doc.paths["/v1/chat/completions"]).toBeDefined();
    } finally {
      await none.stop();
    }
  });
});

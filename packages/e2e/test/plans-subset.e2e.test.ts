// A configuration with only some of the paid door's plans, or none: the gateway starts, serves
// the plans it has, refuses the others with a code the error table names, and with no plans
// has no paid door at all.

import { readFileSync } from "node:fs";
import { DEMO_CONFIG } from "@tollgate/testkit/stack";
import { afterEach, describe, expect, it } from "vitest";
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";

const demo = readFileSync(DEMO_CONFIG, "utf8");
const PLANS = /^plans:\n(?: {2}.*\n)+/m;

/** The demo configuration with `plans` replaced and its upstream pointed at the test's fake. */
const withPlans = (plans: string) => (upstreamUrl: string) =>
  demo.replace("http://127.0.0.1:18000/v1", upstreamUrl).replace(PLANS, plans);

let gateway: ConfiguredGateway | undefined;
afterEach(async () => {
  await gateway?.stop();
  gateway = undefined;
});

async function paid(plan: string): Promise<{ status: number; code?: string; message?: string }> {
  const res = await fetch(`${gateway!.gateway.url}/v1/mpp/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      plan,
      model_optimization: true,
      max_tokens: 16,
      messages: [{ role: "user", content: "Hi" }],
    }),
  });
  const body = (await res.json().catch(() => ({}))) as { error?: { code: string; message: string } };
  return {
    status: res.status,
    ...(body.error ? { code: body.error.code, message: body.error.message } : {}),
  };
}

describe("a configuration with a subset of the plans", () => {
  it("challenges the plan it offers and refuses another with 400 mpp_invalid_request", async () => {
    expect(demo).toMatch(PLANS);
    gateway = await startConfiguredGateway(
      withPlans("plans:\n  Starter: { models: [tollgate-mini], default: tollgate-mini }\n"),
    );
    expect(Object.keys(gateway.gateway.gateway.plans ?? {})).toEqual(["Starter"]);
    expect((await paid("Starter")).status).toBe(402);
    expect(await paid("Premium")).toEqual({
      status: 400,
      code: "mpp_invalid_request",
      message: "plan Premium is not offered by this gateway; offered: Starter",
    });
  });

  it("with no plans starts with the paid door off, and the account door still serves", async () => {
    gateway = await startConfiguredGateway(withPlans(""));
    expect(gateway.gateway.gateway.plans).toBeUndefined();
    expect(gateway.gateway.tempoRpcUrl).toBeUndefined();
    expect((await paid("Starter")).status).toBe(404);
    const models = await fetch(`${gateway.gateway.url}/v1/models`, {
      headers: { authorization: `Bearer ${gateway.gateway.demoKey}` },
    });
    expect(models.status).toBe(200);
  });
});

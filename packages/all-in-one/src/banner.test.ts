import { type GatewayConfig, loadGatewayConfig, parseGatewayConfig } from "@tollgate/config";
import { ConfigError } from "@tollgate/kit/config";
import { describe, expect, it } from "vitest";
import { demoKeyOf } from "./app.js";
import { bannerText, describeStartupError } from "./banner.js";
import { DEMO_CONFIG_PATH, loadConfig } from "./config.js";

/** An operator's real Virtual Key, as distinctive as a leak would be easy to find. */
const OPERATOR_SECRET = "tg_SWEEPCFGSECRET_0123456789abcdef0123456789";

/** The banner `make start` prints for `gateway`, its key chosen as startAllInOne chooses it. */
function bannerFor(gateway: GatewayConfig): string {
  const demoKey = demoKeyOf(gateway);
  return bannerText(
    { url: "http://127.0.0.1:8080", gateway, ...(demoKey ? { demoKey } : {}) },
    loadConfig({ TOLLGATE_CONFIG: "/etc/tollgate/tollgate.yaml" }),
  );
}

/** The development key the bundled demo configuration writes down. */
const demoSecret = () =>
  loadGatewayConfig(DEMO_CONFIG_PATH).accounts[0]!.connections[0]!.keys.find((k) => k.secret)!.secret!;

describe("the banner's key", () => {
  it("prints no key of an operator's own configuration, only how to call with one of its keys", () => {
    const gateway = parseGatewayConfig(
      {
        upstreams: [{ id: "local", baseUrl: "http://127.0.0.1:9/v1" }],
        models: [
          {
            id: "house-model",
            upstream: "local",
            upstreamModel: "m",
            runtime: "vllm",
            pricing: { inputPerMillion: 1, outputPerMillion: 1 },
          },
        ],
        accounts: [
          {
            id: "acme",
            connections: [
              {
                id: "main",
                models: ["house-model"],
                defaultModel: "house-model",
                keys: [{ id: "prod", secret: OPERATOR_SECRET }],
              },
            ],
          },
        ],
      },
      "tollgate.yaml",
    );
    const text = bannerFor(gateway);
    expect(text).not.toContain(OPERATOR_SECRET);
    expect(text).not.toContain("SWEEPCFGSECRET");
    expect(text).not.toContain("demo key:");
    expect(text).toContain("use one of your configuration's keys");
    expect(text).toContain('-H "Authorization: Bearer $KEY"');
    expect(text).toContain('"model":"house-model"');
  });

  it("prints the bundled demo configuration's development key, and no key added beside it", () => {
    const demo = demoSecret();
    const text = bannerFor(loadGatewayConfig(DEMO_CONFIG_PATH));
    expect(text).toContain(`  demo key: ${demo}\n`);
    expect(text).toContain(`-H "Authorization: Bearer ${demo}"`);
    expect(text).toContain('"model":"tollgate-mini"');
    // A copy of the demo with an operator's key listed before the demo's: still only the demo's.
    const copied = structuredClone(loadGatewayConfig(DEMO_CONFIG_PATH));
    const keys = copied.accounts[0]!.connections[0]!.keys;
    keys.unshift({ ...keys[0]!, id: "prod", secret: OPERATOR_SECRET });
    const copy = bannerFor(copied);
    expect(copy).toContain(`  demo key: ${demo}\n`);
    expect(copy).not.toContain(OPERATOR_SECRET);
  });
});

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

  it("names an unreachable Redis or NATS by address and variable, without the URL's password", () => {
    const stores = loadConfig({
      REDIS_URL: "redis://:redispw-SECRET@127.0.0.1:6390",
      NATS_URL: "nats://user:natspw-SECRET@127.0.0.1:4290,nats://tok-SECRET@10.0.0.2:4222",
    });
    const redisDown = Object.assign(new Error("Reached the max retries per request limit (which is 0)."), {
      name: "MaxRetriesPerRequestError",
    });
    const natsDown = Object.assign(
      new Error("connection refused", { cause: Object.assign(new Error("x"), { code: "ECONNREFUSED" }) }),
      { name: "ConnectionError" },
    );
    const redisText = describeStartupError(redisDown, stores);
    const natsText = describeStartupError(natsDown, stores);
    expect(redisText).toBe(
      "tollgate: cannot reach Redis at redis://127.0.0.1:6390 (REDIS_URL): nothing answered. Start Redis there, or unset REDIS_URL to keep the store in memory.",
    );
    expect(natsText).toContain(
      "tollgate: cannot reach NATS at nats://127.0.0.1:4290,nats://10.0.0.2:4222 (NATS_URL): ECONNREFUSED.",
    );
    expect(`${redisText}${natsText}`).not.toContain("SECRET");
  });

  it("names an unreachable store without a password that has an @, nor one given in the query", () => {
    const redisDown = Object.assign(new Error("Reached the max retries per request limit (which is 0)."), {
      name: "MaxRetriesPerRequestError",
    });
    const natsDown = Object.assign(new Error("connection refused"), { name: "ConnectionError" });
    const texts = [
      describeStartupError(redisDown, loadConfig({ REDIS_URL: "redis://:pw@SECRET@127.0.0.1:6390" })),
      describeStartupError(redisDown, loadConfig({ REDIS_URL: "redis://127.0.0.1:6390/0?password=SECRET" })),
      describeStartupError(redisDown, loadConfig({ REDIS_URL: "rediss://u:p/SECRET@127.0.0.1:6390" })),
      describeStartupError(natsDown, loadConfig({ NATS_URL: "nats://u:pw@SECRET@127.0.0.1:4290" })),
      describeStartupError(natsDown, loadConfig({ NATS_URL: "nats://tok/SECRET@127.0.0.1:4290" })),
    ];
    for (const text of texts) expect(text).not.toContain("SECRET");
    expect(texts[0]).toContain("cannot reach Redis at redis://127.0.0.1:6390 (REDIS_URL)");
    expect(texts[1]).toContain("cannot reach Redis at redis://127.0.0.1:6390 (REDIS_URL)");
    expect(texts[3]).toContain("cannot reach NATS at nats://127.0.0.1:4290 (NATS_URL)");
  });

  it("lists configuration problems once, and keeps other messages without a stack", () => {
    const text = describeStartupError(new ConfigError(["a: bad", "b: worse"]), cfg);
    expect(text).toBe("tollgate: invalid configuration:\n  - a: bad\n  - b: worse");
    expect(describeStartupError(new Error("boom"), cfg)).toBe("tollgate: could not start: boom");
  });
});

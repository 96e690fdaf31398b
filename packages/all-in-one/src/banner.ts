import { ConfigError, shownServers } from "@tollgate/kit/config";
import type { AllInOne } from "./app.js";
import type { AllInOneConfig } from "./config.js";

/**
 * Tells a person at the terminal how to call the gateway. The demo key is printed here on
 * purpose, never through the logger: app.demoKey is only ever the bundled demo configuration's
 * development key (demoKeyOf in app.ts). With any other configuration no key is printed, only
 * how to call with one of its keys; the admin token never is.
 */
export function printBanner(app: AllInOne, cfg: AllInOneConfig): void {
  process.stderr.write(bannerText(app, cfg));
}

/** The banner's text (see printBanner). */
export function bannerText(
  app: Pick<AllInOne, "url" | "gateway" | "demoKey" | "upstream" | "metricsUrl" | "tempoRpcUrl" | "devnet">,
  cfg: AllInOneConfig,
): string {
  const lines = [
    "",
    `Tollgate is running on ${app.url}`,
    `  store: ${cfg.redisUrl ? "Redis" : "in memory"}   bus: ${cfg.natsUrl ? "NATS JetStream" : "in memory"}   upstream: ${app.upstream ? "bundled fake" : "configured"}`,
  ];
  if (app.metricsUrl) lines.push(`  metrics: ${app.metricsUrl}`);
  const adminUrl = cfg.adminToken ? `http://127.0.0.1:${cfg.adminPort ?? 8081}` : undefined;
  if (adminUrl) {
    lines.push(
      `  admin API: ${adminUrl}/admin/v1 (on because ADMIN_TOKEN is set; send it as the bearer token)`,
    );
  } else {
    lines.push(
      "  admin API: off (set ADMIN_TOKEN, 16 characters or more, to serve it on 127.0.0.1:ADMIN_PORT)",
    );
  }
  if (app.demoKey || app.gateway.accounts.length > 0) {
    // An operator's own keys are Virtual Keys, never printed: the curl lines read $KEY instead.
    const bearer = app.demoKey ?? "$KEY";
    lines.push(
      app.demoKey
        ? `  demo key: ${app.demoKey}`
        : "  key: use one of your configuration's keys (only the bundled demo configuration's key is printed)",
      "",
      "Try it:",
      ...(app.demoKey ? [] : ["  export KEY=<one of your configuration's keys>"]),
      `  curl -s ${app.url}/v1/models -H "Authorization: Bearer ${bearer}"`,
      `  curl -s ${app.url}/v1/chat/completions -H "Authorization: Bearer ${bearer}" \\`,
      `    -H "Content-Type: application/json" \\`,
      `    -d '{"model":${JSON.stringify(exampleModel(app))},"max_tokens":32,"messages":[{"role":"user","content":"Hello"}]}'`,
    );
  }
  if (adminUrl) {
    lines.push(
      "",
      "Admin API:",
      `  curl -s ${adminUrl}/admin/v1/usage -H "Authorization: Bearer $ADMIN_TOKEN"`,
    );
  }
  if (app.tempoRpcUrl) {
    lines.push(
      "",
      `Paid door: POST ${app.url}/v1/mpp/chat/completions (HTTP 402 + MPP session payments)`,
      `  chain: ${app.devnet ? "bundled Tempo devnet" : "Tempo"} at ${app.tempoRpcUrl}`,
    );
    if (app.devnet) {
      const plan = Object.keys(app.gateway.plans ?? {})[0] ?? "Starter";
      lines.push(
        "  pay with the demo payer (a development key):",
        `  export TOLLGATE_PAYER_KEY=$(npx tsx -e 'import("@tollgate/demo/tempo-devnet").then((m) => console.log(m.DEMO_PAYER_PRIVATE_KEY))')`,
        `  npx tsx packages/agent-client/src/cli.ts chat --url ${app.url} --rpc ${app.tempoRpcUrl} --plan ${plan} --max-tokens 32 --repeat 3 --close "Say hello"`,
      );
    }
  }
  lines.push("");
  return `${lines.join("\n")}\n`;
}

/**
 * A model the printed key may call: the demo key's connection's default; without a printed key,
 * the first connection's default; else the configuration's first model.
 */
function exampleModel(app: Pick<AllInOne, "gateway" | "demoKey">): string {
  for (const a of app.gateway.accounts)
    for (const c of a.connections)
      if (!app.demoKey || c.keys.some((k) => k.secret === app.demoKey)) return c.defaultModel;
  return app.gateway.models[0]?.id ?? "MODEL";
}

/** The environment variables that name each listening port of the all-in-one process. */
function portVariables(cfg: AllInOneConfig | undefined, port: number): string[] {
  if (!cfg) return [];
  const candidates: [string, number | undefined][] = [
    ["PORT", cfg.port],
    ["ADMIN_PORT", cfg.adminToken ? (cfg.adminPort ?? 8081) : undefined],
    ["METRICS_PORT", cfg.metricsPort],
    ["TEMPO_DEVNET_PORT", cfg.tempoRpcUrl ? undefined : cfg.tempoDevnetPort],
  ];
  return candidates.filter(([, p]) => p === port).map(([name]) => name);
}

/**
 * One message a person can act on, without a stack trace: which address is taken and which
 * variable moves it, or each configuration problem once. Anything else keeps its message.
 */
export function describeStartupError(err: unknown, cfg: AllInOneConfig | undefined): string {
  if (err instanceof ConfigError) {
    return ["tollgate: invalid configuration:", ...err.problems.map((p) => `  - ${p}`)].join("\n");
  }
  const e = err as NodeJS.ErrnoException & { address?: string; port?: number };
  if ((e?.code === "EADDRINUSE" || e?.code === "EACCES") && e.syscall === "listen" && e.port !== undefined) {
    const where = `${e.address?.includes(":") ? `[${e.address}]` : (e.address ?? "")}:${e.port}`;
    const vars = portVariables(cfg, e.port);
    const named = vars.length > 0 ? vars.join(" and ") : "the port variable";
    const why =
      e.code === "EADDRINUSE"
        ? "is already in use (another Tollgate, or another program, is listening there)"
        : "may not be opened by this user";
    const conflict = vars.length > 1 ? `; ${vars.join(" and ")} name the same port, give each its own` : "";
    return `tollgate: cannot listen on ${where}: it ${why}. Stop the other process or set ${named} to a free port (0 picks one)${conflict}.`;
  }
  const unreachable = unreachableStore(err, cfg);
  if (unreachable) return unreachable;
  const message = err instanceof Error ? err.message : String(err);
  return `tollgate: could not start: ${message}`;
}

/**
 * The Redis or NATS the process was told to use but could not reach at start, named by its
 * address (never the URL's credentials) and the variable that set it. ioredis reports a first
 * command refused while nothing answers as MaxRetriesPerRequestError, nats.js as ConnectionError.
 */
function unreachableStore(err: unknown, cfg: AllInOneConfig | undefined): string | undefined {
  const e = err as (Error & { cause?: { code?: string } }) | undefined;
  const name = e?.name;
  const reason = e?.cause?.code ?? e?.message;
  if (name === "MaxRetriesPerRequestError" && cfg?.redisUrl) {
    return `tollgate: cannot reach Redis at ${shownServers(cfg.redisUrl, { scheme: true })} (REDIS_URL): nothing answered. Start Redis there, or unset REDIS_URL to keep the store in memory.`;
  }
  if (name === "ConnectionError" && cfg?.natsUrl) {
    return `tollgate: cannot reach NATS at ${shownServers(cfg.natsUrl, { scheme: true })} (NATS_URL): ${reason}. Start NATS with JetStream there (nats-server -js), or unset NATS_URL to keep the bus in memory.`;
  }
  return undefined;
}

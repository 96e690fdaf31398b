import type { AllInOne } from "./app.js";
import type { AllInOneConfig } from "./config.js";

/**
 * Tells a person at the terminal how to call the gateway. The demo key is printed here on
 * purpose (it is the demo configuration's development key), never through the logger.
 */
export function printBanner(app: AllInOne, cfg: AllInOneConfig): void {
  const lines = [
    "",
    `Tollgate is running on ${app.url}`,
    `  store: ${cfg.redisUrl ? "Redis" : "in memory"}   bus: ${cfg.natsUrl ? "NATS JetStream" : "in memory"}   upstream: ${app.upstream ? "bundled fake" : "configured"}`,
  ];
  if (app.metricsUrl) lines.push(`  metrics: ${app.metricsUrl}`);
  if (app.demoKey) {
    lines.push(
      `  demo key: ${app.demoKey}`,
      "",
      "Try it:",
      `  curl -s ${app.url}/v1/models -H "Authorization: Bearer ${app.demoKey}"`,
      `  curl -s ${app.url}/v1/chat/completions -H "Authorization: Bearer ${app.demoKey}" \\`,
      `    -H "Content-Type: application/json" \\`,
      `    -d '{"model":"tollgate-mini","max_tokens":32,"messages":[{"role":"user","content":"Hello"}]}'`,
    );
  }
  if (app.tempoRpcUrl) {
    lines.push(
      "",
      `Paid door: POST ${app.url}/v1/mpp/chat/completions (HTTP 402 + MPP session payments)`,
      `  chain: ${app.devnet ? "bundled Tempo devnet" : "Tempo"} at ${app.tempoRpcUrl}`,
    );
    if (app.devnet) {
      lines.push(
        "  pay with the demo payer (a development key):",
        `  export TOLLGATE_PAYER_KEY=$(npx tsx -e 'import("@tollgate/demo/tempo-devnet").then((m) => console.log(m.DEMO_PAYER_PRIVATE_KEY))')`,
        `  npx tsx packages/agent-client/src/cli.ts chat --url ${app.url} --rpc ${app.tempoRpcUrl} --plan Starter --max-tokens 32 --repeat 3 --close "Say hello"`,
      );
    }
  }
  lines.push("");
  process.stderr.write(`${lines.join("\n")}\n`);
}

// `make up`: every service its own process against real NATS and Redis, two inference-routers.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { shownServers } from "@tollgate/kit/config";
import { commandLineOf } from "@tollgate/testkit/recorded-process";
import { REPO_ROOT, startStack } from "@tollgate/testkit/stack";
import { portsInUse, upPorts } from "@tollgate/testkit/up-ports";
import { runningStack } from "./state.js";

const stateDir = join(REPO_ROOT, ".tollgate");
const natsUrl = process.env.NATS_URL ?? "nats://127.0.0.1:4222";
const redisUrl = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";

// The ports the chart gives each service (packages/config/src/topology.ts), each movable by its
// variable (docs/configuration.md, "`make up`").
let ports: ReturnType<typeof upPorts>;
try {
  ports = upPorts(process.env);
} catch (err) {
  console.error((err as Error).message);
  process.exit(1);
}
// A second stack over a running one would replace the record `make down` stops by.
const running = runningStack();
if (running.length > 0) {
  console.error(
    `a stack started by \`make up\` is still running (${running.map((p) => `${p.name} pid ${p.pid}`).join(", ")}): \`make down\` stops it`,
  );
  process.exit(1);
}
const inUse = await portsInUse(ports);
if (inUse.length > 0) {
  console.error(inUse.join("\n"));
  process.exit(1);
}
const stack = await startStack({
  natsUrl,
  redisUrl,
  routers: 2,
  ...ports,
  logDir: join(stateDir, "logs"),
});
writeFileSync(
  join(stateDir, "stack.json"),
  JSON.stringify(
    {
      processes: stack.processes.map((p) => {
        const commandLine = p.child.pid !== undefined ? commandLineOf(p.child.pid) : undefined;
        return {
          name: p.name,
          pid: p.child.pid,
          port: p.port,
          ...(commandLine !== undefined ? { commandLine } : {}),
        };
      }),
    },
    null,
    2,
  ),
);
console.log(
  `Tollgate stack is up on ${stack.url} (NATS ${shownServers(natsUrl, { scheme: true })}, Redis ${shownServers(redisUrl, { scheme: true })})`,
);
for (const p of stack.processes) {
  const metrics = stack.metricsUrls[p.name];
  console.log(
    `  ${p.name.padEnd(20)} pid ${p.child.pid}  port ${p.port}${metrics ? `  metrics ${metrics}` : ""}`,
  );
}
console.log(`  demo key: ${stack.demoKey}`);
// The admin token is random per `make up`: printed here once, and nowhere else.
console.log(`  admin API: ${stack.adminUrls[0]} (tollgatectl), token for this run:`);
console.log(`    export TOLLGATE_ADMIN_URL=${stack.adminUrls[0]} TOLLGATE_ADMIN_TOKEN=${stack.adminToken}`);
console.log(`  paid door: POST ${stack.url}/v1/mpp/chat/completions, Tempo devnet ${stack.tempoRpcUrl}`);
console.log(`  logs: .tollgate/logs/<service>.log   stop: make down`);
process.exit(0);

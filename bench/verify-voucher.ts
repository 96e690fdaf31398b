// The paid door's Verify alone (docs/performance.md, "The paid door's figure"): mpp-payment's
// domain Verify with its hold, of a new voucher per request (as the mppx client pays) and of a
// reused one, on the Redis store of a real Redis (REDIS_URL, default 127.0.0.1:6379), in this
// process: no gRPC, a stand-in chain. Prints each one's p50 wall and CPU time and the Redis
// commands it sent. N (300) vouchers each; the keys it made are removed at the end.
//
//   npx tsx bench/verify-voucher.ts
import { createLogger } from "@tollgate/kit/log";
import { connectRedis, quitRedis } from "@tollgate/kit/redis";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { createRedisChannelStore } from "../services/mpp-payment/src/adapters/redis-channel-store.js";
import { createCatalog } from "../services/mpp-payment/src/domain/catalog.js";
import { createPayments } from "../services/mpp-payment/src/domain/payments.js";
import {
  FakeChain,
  PATH,
  paidRequest,
  TestPayer,
  testGateway,
  testSettings,
  UNIT,
} from "../services/mpp-payment/test/support.js";

const N = Number(process.env["N"] ?? 300);
const redis = connectRedis(process.env["REDIS_URL"] || "redis://127.0.0.1:6379");
let commands = 0;
const send = redis.sendCommand.bind(redis);
redis.sendCommand = ((c: unknown, ...r: unknown[]) => {
  commands++;
  return (send as (...a: unknown[]) => unknown)(c, ...r);
}) as typeof redis.sendCommand;
const prefix = `tollgate:bench_${Date.now()}_${process.pid}:`;
const PAYEE = privateKeyToAccount(generatePrivateKey()).address;
const chain = new FakeChain();
chain.openDeposit = 10_000n * UNIT;
const payments = createPayments({
  settings: testSettings(PAYEE),
  catalog: createCatalog(testGateway()),
  store: createRedisChannelStore(redis, { prefix }),
  chain,
  log: createLogger({ service: "bench", level: "silent" }),
});
const payer = new TestPayer(PAYEE);
await payer.openOn(payments);
const req = paidRequest();
let seq = 0;
const p50 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;
async function run(label: string, creds: string[], print = true) {
  const ms: number[] = [];
  const cpu: number[] = [];
  let cmds = 0;
  for (const authorization of creds) {
    const c0 = commands;
    const u0 = process.cpuUsage();
    const t0 = performance.now();
    const r = await payments.verifyAndReserve(
      { authorization, httpMethod: "POST", path: PATH, body: req.body },
      `req_${seq++}`,
    );
    ms.push(performance.now() - t0);
    const u = process.cpuUsage(u0);
    cpu.push((u.user + u.system) / 1000);
    cmds += commands - c0;
    if (!r.held) throw new Error("no hold");
    await payments.commit(r.held.reservationId, payer.channelId, "ch", "100");
  }
  if (print)
    console.log(
      `${label}: ${creds.length} Verify, p50 ${p50(ms).toFixed(3)} ms wall, p50 ${p50(cpu).toFixed(3)} ms CPU, ${(cmds / creds.length).toFixed(2)} Redis commands each`,
    );
}
const fresh: string[] = [];
for (let i = 1; i <= N; i++)
  fresh.push(payer.credential(payments.challenge(req).header, await payer.voucher(UNIT + BigInt(i) * 1000n)));
await run("new voucher", fresh.slice(0, 20), false); // warm-up
await run("new voucher", fresh.slice(20));
const last = UNIT + BigInt(N) * 1000n;
const reused: string[] = [];
for (let i = 0; i < N; i++)
  reused.push(payer.credential(payments.challenge(req).header, await payer.voucher(last)));
await run("reused voucher", reused);
const keys = await redis.keys(`${prefix}*`);
if (keys.length) await redis.del(...keys);
await quitRedis(redis);

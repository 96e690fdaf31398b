import { readFileSync } from "node:fs";
import { type GatewayConfig, loadGatewayConfig } from "@tollgate/config";
import {
  ConfigError,
  grpcServerOptions,
  grpcServiceEnv,
  parseEnv,
  port,
  redisClusterNodes,
} from "@tollgate/kit/config";
import { loadInternalAuth } from "@tollgate/kit/credentials";
import { redisUrlOf } from "@tollgate/kit/redis";
import { otelEnv, type TracingOptions, tracingOptions } from "@tollgate/kit/tracing";
import type { Address, Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { z } from "zod";
import type { MppPaymentOptions } from "./app.js";
import { DEFAULTS } from "./defaults.js";

const address = z.string().regex(/^0x[0-9a-fA-F]{40}$/, "must be a 0x-prefixed 20-byte hex address");
const amount = (fallback: bigint) =>
  z
    .string()
    .regex(/^[1-9][0-9]{0,15}$/, "must be a positive integer of base units below 2^53")
    .transform((v) => BigInt(v))
    .refine((v) => v <= BigInt(Number.MAX_SAFE_INTEGER), "must be below 2^53")
    .default(fallback);
const positiveInt = (fallback: number) => z.coerce.number().int().positive().default(fallback);

// Secrets (MPP_SECRET[_FILE], MPP_PAYEE_KEY[_FILE]) are read outside zod so no value can ever
// appear in a problem message; they have no default.
const envSchema = z.object({
  TOLLGATE_CONFIG: z.string({
    error: "required: path of the Tollgate configuration file (plans, models, prices)",
  }),
  ...grpcServiceEnv(50052),
  REDIS_URL: z.string().optional(),
  REDIS_CLUSTER_NODES: redisClusterNodes,
  REDIS_PREFIX: z.string().default(DEFAULTS.redisPrefix),
  MPP_REALM: z.string().default(DEFAULTS.realm),
  TEMPO_RPC_URL: z.url({ error: "required: URL of the Tempo JSON-RPC endpoint" }),
  TEMPO_CHAIN_ID: positiveInt(DEFAULTS.chainId),
  TEMPO_RPC_TIMEOUT_MS: positiveInt(DEFAULTS.rpcTimeoutMs),
  MPP_CURRENCY: address.default(DEFAULTS.currency),
  MPP_ESCROW: address.default(DEFAULTS.escrow),
  MPP_RECIPIENT: address.optional(),
  MPP_VOUCHER_BUCKET: amount(DEFAULTS.voucherBucket),
  MPP_SUGGESTED_DEPOSIT: amount(DEFAULTS.suggestedDeposit),
  MPP_CHALLENGE_TTL_SECONDS: positiveInt(DEFAULTS.challengeTtlSeconds),
  MPP_PAYER_ALLOWLIST: z
    .string()
    .transform((v) =>
      v
        .split(",")
        .map((a) => a.trim())
        .filter(Boolean),
    )
    .pipe(z.array(address).min(1, "must list at least one address"))
    .optional(),
  MPP_MAX_CREDENTIAL_BYTES: positiveInt(DEFAULTS.maxCredentialBytes),
  MPP_SETTLE_INTERVAL_SECONDS: z.coerce.number().int().min(0).default(DEFAULTS.settleIntervalSeconds),
  MPP_RESERVATION_TTL_SECONDS: positiveInt(DEFAULTS.reservationTtlSeconds),
  /** Prometheus /metrics; 0 picks a free port. */
  METRICS_HOST: z.string().default("127.0.0.1"),
  METRICS_PORT: port(9052),
  ...otelEnv,
});

/** Everything mpp-payment needs to start on its own. */
export interface MppPaymentConfig extends MppPaymentOptions {
  logLevel: string;
  /** The bound on the process's stop (SHUTDOWN_TIMEOUT_SECONDS). */
  shutdownTimeoutMs: number;
  /** OpenTelemetry export; undefined (the default) keeps tracing off. */
  tracing?: TracingOptions;
}

/** A secret from NAME or NAME_FILE (a mounted file; one trailing newline is dropped). */
function secretOf(env: NodeJS.ProcessEnv, name: string, problems: string[]): string | undefined {
  const value = env[name] || undefined;
  const file = env[`${name}_FILE`] || undefined;
  if (value !== undefined && file !== undefined) {
    problems.push(`${name}: set ${name} or ${name}_FILE, not both`);
    return undefined;
  }
  if (file === undefined) return value;
  try {
    return readFileSync(file, "utf8").replace(/\r?\n$/, "");
  } catch (err) {
    problems.push(`${name}_FILE: cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? "error"})`);
    return undefined;
  }
}

/** Reads the environment, the secrets and the configuration file; throws ConfigError naming every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): MppPaymentConfig {
  const problems: string[] = [];
  let e: z.output<typeof envSchema> | undefined;
  try {
    e = parseEnv(envSchema, env);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.problems);
  }

  const secret = secretOf(env, "MPP_SECRET", problems);
  if (secret === undefined && !problems.some((p) => p.startsWith("MPP_SECRET"))) {
    problems.push(
      "MPP_SECRET: required (or MPP_SECRET_FILE): the HMAC key of challenge ids, at least 32 bytes",
    );
  } else if (secret !== undefined && Buffer.byteLength(secret, "utf8") < 32) {
    problems.push("MPP_SECRET: must be at least 32 bytes");
  }

  const rawKey = secretOf(env, "MPP_PAYEE_KEY", problems)?.trim();
  let payeeKey: Hex | undefined;
  let payee: Address | undefined;
  if (rawKey !== undefined) {
    if (/^(0x)?[0-9a-fA-F]{64}$/.test(rawKey)) {
      payeeKey = (rawKey.startsWith("0x") ? rawKey : `0x${rawKey}`) as Hex;
      payee = privateKeyToAccount(payeeKey).address;
    } else {
      problems.push("MPP_PAYEE_KEY: must be a 32-byte hex private key");
    }
  }
  const recipient = (e?.MPP_RECIPIENT as Address | undefined) ?? payee;
  if (!env["MPP_RECIPIENT"] && rawKey === undefined) {
    problems.push("MPP_RECIPIENT: required unless MPP_PAYEE_KEY (or MPP_PAYEE_KEY_FILE) is set");
  }
  if (e?.MPP_RECIPIENT && payee && e.MPP_RECIPIENT.toLowerCase() !== payee.toLowerCase()) {
    problems.push(
      "MPP_RECIPIENT: differs from the payee key's address; the escrow accepts settle and close only from the payee",
    );
  }

  let gateway: GatewayConfig | undefined;
  if (e) {
    try {
      gateway = loadGatewayConfig(e.TOLLGATE_CONFIG);
      if (!gateway.plans)
        problems.push(`${e.TOLLGATE_CONFIG}: plans: required by the paid door (Starter, Plus, Premium)`);
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      problems.push(...err.problems);
    }
  }

  if (problems.length > 0 || !e || !gateway || secret === undefined) throw new ConfigError(problems);
  const redisUrl = redisUrlOf(e.REDIS_URL, e.REDIS_CLUSTER_NODES);
  return {
    ...grpcServerOptions(e),
    internalAuth: loadInternalAuth(env, { server: true, client: false }),
    logLevel: e.LOG_LEVEL,
    shutdownTimeoutMs: e.SHUTDOWN_TIMEOUT_SECONDS * 1_000,
    gateway,
    ...(redisUrl ? { redisUrl } : {}),
    redisPrefix: e.REDIS_PREFIX,
    secret,
    realm: e.MPP_REALM,
    tempoRpcUrl: e.TEMPO_RPC_URL,
    rpcTimeoutMs: e.TEMPO_RPC_TIMEOUT_MS,
    chainId: e.TEMPO_CHAIN_ID,
    currency: e.MPP_CURRENCY as Address,
    escrow: e.MPP_ESCROW as Address,
    ...(payeeKey ? { payeeKey } : {}),
    ...(recipient ? { recipient } : {}),
    voucherBucket: e.MPP_VOUCHER_BUCKET,
    suggestedDeposit: e.MPP_SUGGESTED_DEPOSIT,
    challengeTtlSeconds: e.MPP_CHALLENGE_TTL_SECONDS,
    ...(e.MPP_PAYER_ALLOWLIST ? { payerAllowlist: e.MPP_PAYER_ALLOWLIST as Address[] } : {}),
    maxCredentialBytes: e.MPP_MAX_CREDENTIAL_BYTES,
    settleIntervalSeconds: e.MPP_SETTLE_INTERVAL_SECONDS,
    reservationTtlSeconds: e.MPP_RESERVATION_TTL_SECONDS,
    metricsHost: e.METRICS_HOST,
    metricsPort: e.METRICS_PORT,
    tracing: tracingOptions(e, "mpp-payment"),
  };
}

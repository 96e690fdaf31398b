#!/usr/bin/env tsx
/**
 * tollgate-pay: pays the gateway's MPP route (POST /v1/mpp/chat/completions) from the command line.
 * One run keeps one session in memory: open → N requests (reusing the voucher) → optional close.
 * Answers go to stdout; payment progress and errors go to stderr. The private key is never printed.
 */
import { chmodSync, existsSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { type Hex, parseUnits } from "viem";
import { describeFailure } from "./failure.js";
import {
  answerText,
  type CloseResult,
  PaidSession,
  PaidSessionError,
  type PaidSessionEvent,
  type PaidSessionState,
  TOKEN_DECIMALS,
} from "./paid-session.js";

const USAGE = `Usage:
  tollgate-pay chat [options] "prompt"     pay for one or more chat requests
  tollgate-pay close [options]             close a session kept with --state-file

Options:
  --url <base>          gateway base URL (env TOLLGATE_URL; default http://127.0.0.1:8080)
  --rpc <url>           Tempo JSON-RPC URL for signing open/top-up transactions
                        (env TOLLGATE_RPC_URL; default http://127.0.0.1:18545)
  --key-file <path>     file holding the payer's hex private key (else env TOLLGATE_PAYER_KEY)
  --plan <name>         Starter | Plus | Premium (default Starter)
  --max-tokens <n>      output cap sent as max_tokens (default 64)
  --model <id>          a fixed model; needs --no-optimize
  --no-optimize         model_optimization false (the gateway then uses --model)
  --repeat <n>          send the prompt n times on one session (default 1)
  --close               close the session at the end (settle the spend, refund the rest)
  --max-deposit <tok>   cap on the channel deposit, in token units (e.g. 10)
  --state-file <path>   keep the session (channel + voucher, no key) in this file across runs
  --json                print each full response body as one JSON line instead of the answer
  -h, --help            show this help

The prompt is read from stdin when no prompt argument is given. Amounts on stderr are raw base
units (6 decimals) as in the receipts.`;

const PLANS = ["Starter", "Plus", "Premium"] as const;

class UsageError extends Error {}

function log(line: string): void {
  process.stderr.write(`tollgate-pay: ${line}\n`);
}

function readKey(keyFile: string | undefined): Hex {
  let raw: string | undefined;
  if (keyFile !== undefined) {
    try {
      raw = readFileSync(keyFile, "utf8");
    } catch (error) {
      throw new UsageError(`cannot read --key-file: ${(error as NodeJS.ErrnoException).code ?? "error"}`);
    }
    try {
      if ((statSync(keyFile).mode & 0o077) !== 0) {
        log("warning: the key file is readable by other users (chmod 600 it)");
      }
    } catch {
      // the stat only feeds a warning
    }
  } else raw = process.env["TOLLGATE_PAYER_KEY"];
  if (raw === undefined || raw.trim() === "") {
    throw new UsageError("no payer key: pass --key-file <path> or set TOLLGATE_PAYER_KEY");
  }
  const hex = raw.trim().replace(/^0x/i, "");
  // The message names the problem, never the content.
  if (!/^[0-9a-fA-F]{64}$/.test(hex)) throw new UsageError("the payer key is not a 32-byte hex private key");
  return `0x${hex}`;
}

function positiveInt(name: string, value: string | undefined, fallback: number, max: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > max)
    throw new UsageError(`${name} must be an integer from 1 to ${max}`);
  return n;
}

function readState(path: string | undefined): PaidSessionState | undefined {
  if (path === undefined || !existsSync(path)) return undefined;
  try {
    return JSON.parse(readFileSync(path, "utf8")) as PaidSessionState;
  } catch {
    throw new UsageError(`--state-file ${path} is not a session state (JSON)`);
  }
}

function writeState(path: string | undefined, session: PaidSession): void {
  if (path === undefined) return;
  const state = session.state();
  if (!state) {
    rmSync(path, { force: true });
    return;
  }
  writeFileSync(path, `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
  chmodSync(path, 0o600);
}

function printEvent(event: PaidSessionEvent): void {
  switch (event.type) {
    case "open":
      log(`opening channel ${event.channelId} (deposit ${event.deposit}, chain ${event.chainId})`);
      break;
    case "raise":
      log(`raising the voucher ${event.from} → ${event.to} (${event.reason})`);
      break;
    case "top-up":
      log(
        `top-up +${event.additionalDeposit}: ${event.status}${event.status < 300 ? `, deposit now ${event.deposit}` : ""} (${event.reason})`,
      );
      break;
    case "close":
      log(`close credential (cumulative ${event.cumulativeAmount}): ${event.status}`);
      break;
    case "attempt":
      break;
  }
}

function printClose(result: CloseResult): void {
  log(
    `closed channel ${result.channelId}: spent ${result.spent} to the payee, ` +
      `${result.deposit - result.spent} of deposit ${result.deposit} back to the payer, tx ${result.txHash}`,
  );
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8").trim();
}

async function main(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      url: { type: "string" },
      rpc: { type: "string" },
      "key-file": { type: "string" },
      plan: { type: "string" },
      "max-tokens": { type: "string" },
      model: { type: "string" },
      "no-optimize": { type: "boolean" },
      repeat: { type: "string" },
      close: { type: "boolean" },
      "max-deposit": { type: "string" },
      "state-file": { type: "string" },
      json: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
  const [command, ...rest] = positionals;
  if (values.help || command === undefined || command === "help") {
    process.stdout.write(`${USAGE}\n`);
    return command === undefined && !values.help ? 2 : 0;
  }
  if (command !== "chat" && command !== "close") throw new UsageError(`unknown command ${command}`);

  const plan = values.plan ?? "Starter";
  if (!(PLANS as readonly string[]).includes(plan))
    throw new UsageError(`--plan must be one of ${PLANS.join(", ")}`);
  const optimize = !values["no-optimize"];
  if (!optimize && !values.model) throw new UsageError("--no-optimize needs --model <id>");
  if (optimize && values.model) {
    throw new UsageError("--model needs --no-optimize (with model optimization the gateway picks the model)");
  }
  const maxTokens = positiveInt("--max-tokens", values["max-tokens"], 64, 1_000_000);
  const repeat = positiveInt("--repeat", values.repeat, 1, 1000);
  let maxDeposit: bigint | undefined;
  if (values["max-deposit"] !== undefined) {
    if (!/^\d+(\.\d{1,6})?$/.test(values["max-deposit"])) {
      throw new UsageError("--max-deposit is a token amount like 10 or 2.5");
    }
    maxDeposit = parseUnits(values["max-deposit"], TOKEN_DECIMALS);
  }
  const stateFile = values["state-file"];
  if (command === "close" && stateFile === undefined) {
    throw new UsageError(
      "close needs --state-file: a session lives in memory for one run (use chat --close), or in a state file",
    );
  }

  const url = values.url ?? process.env["TOLLGATE_URL"] ?? "http://127.0.0.1:8080";
  const session = new PaidSession({
    url,
    rpcUrl: values.rpc ?? process.env["TOLLGATE_RPC_URL"] ?? "http://127.0.0.1:18545",
    privateKey: readKey(values["key-file"]),
    ...(maxDeposit !== undefined ? { maxDeposit } : {}),
    ...(() => {
      const state = readState(stateFile);
      return state ? { state } : {};
    })(),
    onEvent: printEvent,
  });
  log(`payer ${session.payer}`);
  if (session.channelId) {
    log(
      `resuming channel ${session.channelId} (voucher ${session.cumulativeAmount}, deposit ${session.deposit})`,
    );
  }

  if (command === "close") {
    const result = await session.close({
      probeBody: {
        plan,
        model_optimization: true,
        messages: [{ role: "user", content: "close" }],
        max_tokens: 1,
      },
    });
    writeState(stateFile, session);
    if (!result) log("no open channel in the state file; nothing to close");
    else printClose(result);
    return 0;
  }

  const prompt = rest.length > 0 ? rest.join(" ") : process.stdin.isTTY ? "" : await readStdin();
  if (prompt === "") throw new UsageError('chat needs a prompt: tollgate-pay chat [options] "prompt"');
  const body = {
    plan,
    model_optimization: optimize,
    ...(optimize ? {} : { model: values.model }),
    messages: [{ role: "user", content: prompt }],
    max_tokens: maxTokens,
  };

  let exitCode = 0;
  try {
    for (let i = 1; i <= repeat; i++) {
      const response = await session.chat(body);
      writeState(stateFile, session);
      const trail = response.attempts
        .map((attempt) => `${attempt.action}→${attempt.status}${attempt.code ? ` ${attempt.code}` : ""}`)
        .join(", ");
      log(
        `request ${i}/${repeat}: ${response.status}, voucher ${response.voucher} (cumulative ${response.cumulativeAmount}), ` +
          `receipt spent=${response.receipt.spent} acceptedCumulative=${response.receipt.acceptedCumulative} [${trail}]`,
      );
      if (values.json) process.stdout.write(`${JSON.stringify(response.body ?? response.text)}\n`);
      else process.stdout.write(`${answerText(response.body) ?? response.text}\n`);
    }
  } catch (error) {
    reportError(error, url);
    exitCode = 1;
  } finally {
    writeState(stateFile, session);
    if (values.close && session.channelId) {
      try {
        const result = await session.close();
        writeState(stateFile, session);
        if (result) printClose(result);
      } catch (error) {
        reportError(error, url);
        exitCode = 1;
      }
    } else if (session.channelId) {
      log(
        `channel ${session.channelId} stays open (voucher ${session.cumulativeAmount}, deposit ${session.deposit})` +
          (stateFile ? `; state in ${stateFile}` : "; close it with --close next time"),
      );
    }
  }
  return exitCode;
}

function reportError(error: unknown, gatewayUrl?: string): void {
  if (error instanceof PaidSessionError) {
    const server = error.details.serverCode ? ` [server code ${error.details.serverCode}]` : "";
    log(`error: ${error.code}: ${error.message}${server}`);
  } else if (error instanceof UsageError) {
    log(`usage: ${error.message}`);
  } else {
    // viem and mppx errors carry no key material; keep only the first line.
    log(`error: ${describeFailure(error, gatewayUrl)}`);
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    reportError(error);
    process.exitCode =
      error instanceof UsageError || (error as { code?: string })?.code?.startsWith("ERR_PARSE_ARGS") ? 2 : 1;
  },
);

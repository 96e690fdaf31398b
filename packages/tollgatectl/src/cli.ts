#!/usr/bin/env tsx
/**
 * tollgatectl: manages accounts, connections and Virtual Keys and reads usage through api-edge's
 * admin API (TOLLGATE_ADMIN_URL, default http://127.0.0.1:8081; token in TOLLGATE_ADMIN_TOKEN).
 * Answers go to stdout; warnings and errors to stderr. The admin token is never printed.
 */
import { run } from "./run.js";

process.exitCode = await run(process.argv.slice(2), process.env, {
  out: (text) => process.stdout.write(text),
  err: (text) => process.stderr.write(text),
});

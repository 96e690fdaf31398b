import { describe } from "vitest";
import { ledgerContract } from "../../test/ledger-contract.js";
import { rateLimiterContract } from "../../test/rate-limiter-contract.js";
import { createMemoryLedger } from "./memory-ledger.js";

describe("memory ledger: rate limits", () => {
  rateLimiterContract(() => createMemoryLedger());
});

describe("memory ledger: budgets", () => {
  ledgerContract((opts) => createMemoryLedger(opts));
});

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { createLogger } from "@tollgate/kit/log";
import { AcquireLeaseResponseSchema, type AuthorizeRequestSchema, Route } from "@tollgate/proto/auth";
import { describe, expect, it, vi } from "vitest";
import { LeaseBook, type LeaseClient, ticketOf } from "./leases.js";

const KEYS: Record<string, { accountId: string; keyId: string }> = {
  tg_key_a_0123456789: { accountId: "acme", keyId: "key_a" },
  tg_key_b_0123456789: { accountId: "acme", keyId: "key_b" },
  tg_key_c_0123456789: { accountId: "other", keyId: "key_c" },
};
const [A, B, C] = Object.keys(KEYS) as [string, string, string];

/**
 * A fake auth-policy: grants every lease (each with `requests` request units when given), and
 * records its lease calls in order.
 */
function fakeAuth(opts: { requests?: number } = {}) {
  const calls: string[] = [];
  let n = 0;
  const auth: LeaseClient = {
    acquireLease: async (req) => {
      const key = req.request?.key ?? "";
      calls.push(`acquire ${KEYS[key]?.keyId} ${req.request?.maxOutputTokens}`);
      n++;
      return create(AcquireLeaseResponseSchema, {
        granted: true,
        useMs: 60_000,
        leaseId: `lease_${n}`,
        budget: "1000000",
        ...(opts.requests !== undefined ? { requests: opts.requests } : {}),
        prices: { model: "small", inputPerMillion: "1000000", outputPerMillion: "1000000" },
        grant: {
          principal: { ...KEYS[key], connectionId: "main" },
          model: "small",
          maxOutputTokens: req.request?.maxOutputTokens ?? 0,
          budgetRemaining: "5000000",
        },
      });
    },
    returnLease: async (req) => {
      calls.push(`return ${req.leaseId}`);
      return { $typeName: "tollgate.auth.v1.ReturnLeaseResponse" } as never;
    },
  };
  const book = new LeaseBook(auth, createLogger({ service: "api-edge", level: "silent" }));
  return { book, calls };
}

const ask = (key: string, maxOutputTokens: number): MessageInitShape<typeof AuthorizeRequestSchema> => ({
  key,
  route: Route.CHAT_COMPLETIONS,
  model: "small",
  maxOutputTokens,
  bodyBytes: 40,
  messageCount: 1,
  estimatedInputTokens: 10,
});

/** One request admitted on a lease and ended at once (cost 1), or `running`: left in flight. */
async function request(book: LeaseBook, key: string, cap: number, running = false) {
  const grant = await book.admit(ask(key, cap));
  expect(grant).toBeDefined();
  if (!running) ticketOf(grant!)!.end({ cost: 1n });
  return grant!;
}

describe("LeaseBook: idle leases", () => {
  it("keeps a lease for a caller pausing 300 ms between requests, and returns it once idle 500 ms", async () => {
    // The book's clock and timers are the test's: a busy machine cannot stretch a 300 ms pause
    // past the 500 ms the lease waits, or delay its return.
    vi.useFakeTimers();
    try {
      const { book, calls } = fakeAuth();
      await request(book, A, 8);
      await vi.advanceTimersByTimeAsync(300);
      await request(book, A, 8);
      await vi.advanceTimersByTimeAsync(300);
      await request(book, A, 8);
      await vi.advanceTimersByTimeAsync(499);
      expect(calls).toEqual(["acquire key_a 8"]);
      await vi.advanceTimersByTimeAsync(1);
      expect(calls).toEqual(["acquire key_a 8", "return lease_1"]);
      await book.close();
    } finally {
      vi.useRealTimers();
    }
  });

  it("returns the key's idle leases of other shapes before acquiring one, and waits for them", async () => {
    const { book, calls } = fakeAuth();
    await request(book, A, 8);
    // Another key (of the same account, and of another account) keeps its lease.
    await request(book, B, 8);
    await request(book, C, 8);
    // A's lease of cap 16 is acquired only once its idle lease of cap 8 is back.
    await request(book, A, 16);
    expect(calls).toEqual([
      "acquire key_a 8",
      "acquire key_b 8",
      "acquire key_c 8",
      "return lease_1",
      "acquire key_a 16",
    ]);
    await book.close();
  });

  it("returns a shape's own lease that cannot admit the next request before acquiring its successor", async () => {
    // Two request units a lease: the third request needs another lease of the same shape. The
    // spent one goes back first, so the budget its successor reports (and every request on it
    // tells in x-tollgate-budget-remaining) holds none of its unused allowance.
    const { book, calls } = fakeAuth({ requests: 2 });
    await request(book, A, 8);
    await request(book, A, 8);
    await request(book, A, 8);
    expect(calls).toEqual(["acquire key_a 8", "return lease_1", "acquire key_a 8"]);
    await book.close();
  });

  it("leaves a lease a request still runs on", async () => {
    const { book, calls } = fakeAuth();
    const running = await request(book, A, 8, true);
    await request(book, A, 16);
    expect(calls).toEqual(["acquire key_a 8", "acquire key_a 16"]);
    ticketOf(running)!.end({ cost: 1n });
    await book.close();
  });

  it("returns the idle leases of one key by its id, of one account, or of every key", async () => {
    const { book, calls } = fakeAuth();
    const acquisitions = async () => {
      calls.length = 0;
      for (const key of [A, B, C]) await request(book, key, 8);
    };
    await acquisitions();
    calls.length = 0;
    await book.returnIdleOf({ keyId: "key_b" });
    expect(calls).toEqual(["return lease_2"]);
    await acquisitions();
    calls.length = 0;
    await book.returnIdleOf({ accountId: "acme" });
    expect(calls.sort()).toEqual(["return lease_1", "return lease_4"]);
    await acquisitions();
    calls.length = 0;
    await book.returnIdleOf({});
    expect(calls.sort()).toEqual(["return lease_3", "return lease_5", "return lease_6"]);
    await book.close();
  });
});

describe("LeaseBook: an auth-policy that does not answer", () => {
  it("waits for a return no longer than the request's deadline, and acquires only with time left", async () => {
    vi.useFakeTimers();
    try {
      const { book } = fakeAuth();
      const inner = (book as unknown as { auth: LeaseClient }).auth;
      const timeouts: number[] = [];
      // Returns find no answer: each fails at its deadline (5 s), as a stalled auth-policy's would.
      const stalled: LeaseClient = {
        acquireLease: (req, o) => {
          timeouts.push(o?.timeoutMs ?? Number.POSITIVE_INFINITY);
          return inner.acquireLease(req, o);
        },
        returnLease: (_req, o) =>
          new Promise((_, reject) => setTimeout(() => reject(new Error("deadline")), o?.timeoutMs ?? 0)),
      };
      const slow = new LeaseBook(stalled, createLogger({ service: "api-edge", level: "silent" }));
      await request(slow, A, 8);
      // Another shape of the same key: its acquisition first returns the key's idle lease.
      let admitted: Awaited<ReturnType<LeaseBook["admit"]>> | "waiting" = "waiting";
      void slow.admit(ask(A, 16), Date.now() + 200).then((g) => {
        admitted = g;
      });
      await vi.advanceTimersByTimeAsync(200);
      // Not admitted on a lease: the return used the time, and no acquisition was sent with
      // too little of it left (its lease could be granted after nobody waits for it).
      expect(admitted).toBeUndefined();
      expect(timeouts).toHaveLength(1);
      // With time enough left, the acquisition is sent with what the deadline leaves of it.
      const later = await slow.admit(ask(B, 16), Date.now() + 1_000);
      expect(later).toBeDefined();
      expect(timeouts.at(-1)).toBeLessThanOrEqual(1_000);
      await vi.advanceTimersByTimeAsync(10_000);
      await slow.close();
      await book.close();
    } finally {
      vi.useRealTimers();
    }
  });
});

describe("LeaseBook: keys the admin API changed", () => {
  it("stops admitting on the named keys' leases at once, in use or not, and leaves the others", async () => {
    const { book, calls } = fakeAuth();
    const running = await request(book, A, 8, true);
    await request(book, B, 8);
    await request(book, C, 8);
    calls.length = 0;
    book.stopLeasing({ keyId: "key_a" });
    // A's next request asks auth-policy again; B and C stay on their leases.
    await request(book, A, 8);
    await request(book, B, 8);
    await request(book, C, 8);
    expect(calls).toEqual(["acquire key_a 8"]);
    // The lease a request still ran on goes back once that request ends.
    ticketOf(running)!.end({ cost: 1n });
    expect(calls).toEqual(["acquire key_a 8", "return lease_1"]);
    calls.length = 0;
    book.stopLeasing({ accountId: "acme", connectionId: "main" });
    await request(book, C, 8);
    expect(calls.sort()).toEqual(["return lease_2", "return lease_4"]);
    await book.close();
  });

  it("gives back unused a lease granted while the change was being made, and admits nothing on it", async () => {
    const { book, calls } = fakeAuth();
    let answer!: () => void;
    const gate = new Promise<void>((r) => {
      answer = r;
    });
    const inner = (book as unknown as { auth: LeaseClient }).auth;
    const slow: LeaseClient = {
      acquireLease: async (req, o) => {
        await gate;
        return inner.acquireLease(req, o);
      },
      returnLease: (req, o) => inner.returnLease(req, o),
    };
    const racing = new LeaseBook(slow, createLogger({ service: "api-edge", level: "silent" }));
    const admitted = racing.admit(ask(A, 8));
    await new Promise((r) => setTimeout(r, 5));
    racing.stopLeasing({ keyId: "key_a" });
    answer();
    expect(await admitted).toBeUndefined();
    expect(calls).toEqual(["acquire key_a 8", "return lease_1"]);
    await racing.close();
    await book.close();
  });
});

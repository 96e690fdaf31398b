// The books of one budgeted account on the all-in-one, kept by a test as it goes: what callers
// were told they spent, how many requests were billed, and the check after each case that
// metering recorded exactly that and the budget lost exactly that, with no hold left.
import type { AllInOne } from "@tollgate/all-in-one";
import { type Client, createClient, type MethodsOf } from "@tollgate/kit/grpc";
import { MeteringService, type UsageTotals } from "@tollgate/proto/metering";
import { expect } from "vitest";

export class Books {
  /** What callers were told they spent. */
  told = 0n;
  /** How many requests were billed. */
  billed = 0;
  readonly #metering: Client<MethodsOf<typeof MeteringService>>;
  readonly #url: string;

  constructor(
    gateway: AllInOne,
    private readonly account: { id: string; key: string; budget: bigint },
  ) {
    this.#metering = createClient(MeteringService, gateway.meteringAddr, gateway.internalAuth("api-edge"));
    this.#url = gateway.url;
  }

  /** One billed request whose cost the caller was told. */
  tell(cost: bigint): void {
    this.told += cost;
    this.billed += 1;
  }

  /** Metering's totals, once it has recorded `requests` (20 s at most). */
  async totals(requests = this.billed): Promise<UsageTotals | undefined> {
    let totals: UsageTotals | undefined;
    const deadline = Date.now() + 20_000;
    do {
      totals = (await this.#metering.getUsage({ accountId: this.account.id })).totals;
      if (Number(totals?.requests ?? 0n) >= requests) break;
      await new Promise((r) => setTimeout(r, 100));
    } while (Date.now() < deadline);
    return totals;
  }

  /**
   * A request nobody was told the cost of (a cut stream): its cost is what metering recorded for
   * it since `before`, the totals read before it was sent.
   */
  async billedUntold(before: UsageTotals | undefined): Promise<bigint> {
    const after = await this.totals(this.billed + 1);
    expect(Number(after?.requests)).toBe(this.billed + 1);
    const cost = BigInt(after?.cost ?? "0") - BigInt(before?.cost ?? "0");
    this.tell(cost);
    return cost;
  }

  /**
   * Metering recorded what callers were told; then a probe request sees the budget less exactly
   * that (and its own cost): no hold is left behind.
   */
  async check(): Promise<void> {
    const totals = await this.totals();
    expect(Number(totals?.requests ?? 0n)).toBe(this.billed);
    expect(BigInt(totals?.cost ?? "0")).toBe(this.told);
    // Settlements land right after metering records.
    await new Promise((r) => setTimeout(r, 200));
    const probe = await fetch(`${this.#url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${this.account.key}`, "content-type": "application/json" },
      body: JSON.stringify({ max_tokens: 1, messages: [{ role: "user", content: "probe" }] }),
    });
    expect(probe.status).toBe(200);
    const cost = BigInt(probe.headers.get("x-tollgate-cost") ?? "-1");
    expect(BigInt(probe.headers.get("x-tollgate-budget-remaining") ?? "-1")).toBe(
      this.account.budget - this.told - cost,
    );
    this.tell(cost);
  }

  close(): void {
    this.#metering.$close();
  }
}

import { describe, expect, it } from "vitest";
import { paidRequest, testGateway } from "../../test/support.js";
import { createCatalog } from "./catalog.js";
import { PaymentError } from "./errors.js";

/** A gateway that offers only the Starter plan. */
function starterOnly() {
  const g = testGateway();
  return { ...g, plans: { Starter: g.plans!.Starter! } };
}

describe("a catalog of a configuration with some of the plans", () => {
  it("prices the plans it has", () => {
    const priced = createCatalog(starterOnly()).price(paidRequest({ plan: "Starter" }));
    expect(priced.plan).toBe("Starter");
    expect(priced.quote).toBeGreaterThan(0n);
  });

  it("refuses a plan it leaves out as mpp_invalid_request, naming the plans offered", () => {
    const catalog = createCatalog(starterOnly());
    let caught: unknown;
    try {
      catalog.price(paidRequest({ plan: "Premium" }));
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(PaymentError);
    expect((caught as PaymentError).code).toBe("mpp_invalid_request");
    expect((caught as PaymentError).message).toBe(
      "plan Premium is not offered by this gateway; offered: Starter",
    );
    expect(catalog.offers("Premium", "mini")).toBe(false);
  });
});

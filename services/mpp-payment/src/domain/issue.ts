import type { PaidRequest } from "./catalog.js";
import { type IssuedChallenge, issueChallenge } from "./challenge.js";
import type { PaymentContext } from "./context.js";
import { PaymentError } from "./errors.js";

/** Prices an unpaid request and builds its 402 challenge. */
export function challenge(ctx: PaymentContext, req: PaidRequest): IssuedChallenge {
  const priced = ctx.catalog.price(req);
  if (priced.quote <= 0n) {
    throw new PaymentError("mpp_request_quote_invalid", "no positive quote could be derived for the request");
  }
  if (priced.quote > ctx.s.bucket) {
    throw new PaymentError(
      "mpp_request_exceeds_voucher_bucket",
      "the request's quote exceeds the voucher bucket; send a smaller request",
    );
  }
  return issueChallenge(ctx.s, req, priced, ctx.now());
}

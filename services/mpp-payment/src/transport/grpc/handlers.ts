import type { Handlers } from "@tollgate/kit/grpc";
import { Action, type PaymentService } from "@tollgate/proto/payment";
import type { Binding } from "../../domain/challenge.js";
import { PaymentError } from "../../domain/errors.js";
import type { Payments } from "../../domain/payments.js";
import type { SessionAction } from "../../domain/session-payload.js";
import { toStatusError } from "./errors.js";

const ACTIONS = {
  open: Action.OPEN,
  topUp: Action.TOP_UP,
  voucher: Action.VOUCHER,
  close: Action.CLOSE,
} satisfies Record<SessionAction, Action>;

function bindingMessage(b: Binding) {
  return {
    httpMethod: b.httpMethod,
    path: b.path,
    plan: b.plan,
    model: b.model,
    runtime: b.runtime,
    pricingSnapshotId: b.pricingSnapshotId,
    inputCap: b.inputCap,
    outputCap: b.outputCap,
  };
}

/** Runs a handler body and maps domain errors to their status, once. */
async function mapped<T>(body: () => Promise<T>): Promise<T> {
  try {
    return await body();
  } catch (err) {
    throw toStatusError(err);
  }
}

/** Maps PaymentService messages to the domain and back; amounts cross as decimal strings. */
export function paymentHandlers(payments: Payments): Handlers<typeof PaymentService> {
  return {
    challenge: (req) =>
      mapped(async () => {
        const r = req.request;
        if (!r) throw new PaymentError("mpp_invalid_request", "request is required");
        const issued = payments.challenge({
          httpMethod: r.httpMethod,
          path: r.path,
          plan: r.plan,
          modelOptimization: r.modelOptimization,
          model: r.model,
          outputCap: r.outputCap,
          messageCount: r.messageCount,
          outputSequences: r.outputSequences,
          body: r.body,
        });
        return {
          wwwAuthenticate: issued.header,
          challengeId: issued.id,
          binding: bindingMessage(issued.binding),
        };
      }),

    verify: (req) =>
      mapped(async () => {
        const credentialed = {
          authorization: req.authorization,
          httpMethod: req.httpMethod,
          path: req.path,
          body: req.body,
        };
        // Verify and Reserve in one call when asked (a credential that pays for content only).
        const { verified: v, held } =
          req.reserveRequestId === ""
            ? { verified: await payments.verify(credentialed), held: undefined }
            : await payments.verifyAndReserve(credentialed, req.reserveRequestId);
        return {
          reservationId: held?.reservationId ?? "",
          reservedReceipt: held?.receipt ?? "",
          // With the hold, its receipt is the accepted credential's too: the spend before the request.
          acceptedReceipt: held?.receipt || (v.acceptedReceipt ?? ""),
          action: ACTIONS[v.action],
          channelId: v.channelId,
          challengeId: v.challengeId,
          binding: bindingMessage(v.binding),
          acceptedCumulative: v.acceptedCumulative.toString(),
          paymentReceipt: v.paymentReceipt ?? "",
          quote: v.quote.toString(),
        };
      }),

    reserve: (req) =>
      mapped(async () => {
        const held = await payments.reserve(req.channelId, req.requestId, req.quote, req.challengeId);
        return { reservationId: held.reservationId, reservedReceipt: held.receipt };
      }),

    commit: (req) =>
      mapped(async () => ({
        paymentReceipt: await payments.commit(
          req.reservationId,
          req.channelId,
          req.challengeId,
          req.actualCost,
        ),
      })),

    release: (req) =>
      mapped(async () => {
        await payments.release(req.reservationId, req.channelId);
        return {};
      }),

    close: (req) =>
      mapped(async () => ({
        paymentReceipt: await payments.close({
          authorization: req.authorization,
          httpMethod: req.httpMethod,
          path: req.path,
          body: new Uint8Array(),
        }),
      })),
  };
}

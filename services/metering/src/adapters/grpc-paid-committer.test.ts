import type { Client, MethodsOf } from "@tollgate/kit/grpc";
import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import type { PaymentService } from "@tollgate/proto/payment";
import { describe, expect, it } from "vitest";
import { createPaidCommitter } from "./grpc-paid-committer.js";

type Payment = Client<MethodsOf<typeof PaymentService>>;
const ITEM = { reservationId: `rsv_${"1".repeat(32)}`, channelId: `0x${"ab".repeat(32)}`, cost: 1234n };

/** A PaymentService client whose Commit answers `answer` and remembers what it was asked. */
function paymentClient(answer: () => Promise<{ paymentReceipt: string }>) {
  const asked: unknown[] = [];
  const client = {
    commit: (req: unknown, opts: unknown) => {
      asked.push([req, opts]);
      return answer();
    },
    $close: () => {},
  } as unknown as Payment;
  return { client, asked };
}

const refusal = (hold?: string) =>
  new RemoteError(GrpcStatus.INTERNAL, "mpp_commit_failed", "the reservation is gone", hold ? { hold } : {});

describe("createPaidCommitter", () => {
  it("commits the hold with its channel and cost, no challenge, under a deadline", async () => {
    const { client, asked } = paymentClient(async () => ({ paymentReceipt: "r" }));
    expect(await createPaidCommitter(client).commit(ITEM)).toBe("committed");
    expect(asked).toEqual([
      [
        { reservationId: ITEM.reservationId, channelId: ITEM.channelId, challengeId: "", actualCost: "1234" },
        { timeoutMs: 5_000 },
      ],
    ]);
  });

  it("answers a hold mpp-payment will never charge with why", async () => {
    for (const hold of ["unknown", "released", "expired"]) {
      const { client } = paymentClient(() => Promise.reject(refusal(hold)));
      expect(await createPaidCommitter(client).commit(ITEM)).toBe(hold);
    }
  });

  it("rejects what may pass when tried again: no replica, a store outage, a timeout, a failure naming no hold", async () => {
    for (const err of [
      new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "no connection"),
      new RemoteError(GrpcStatus.UNAVAILABLE, "store_unavailable", "store unavailable"),
      new RemoteError(GrpcStatus.DEADLINE_EXCEEDED, undefined, "deadline"),
      new RemoteError(GrpcStatus.PERMISSION_DENIED, "permission_denied", "metering may not call Commit"),
      refusal(),
      refusal("something-else"),
    ]) {
      const { client } = paymentClient(() => Promise.reject(err));
      await expect(createPaidCommitter(client).commit(ITEM)).rejects.toBe(err);
    }
  });
});

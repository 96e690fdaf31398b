import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { INFERENCE_DETAILS } from "@tollgate/proto/inference";
import { describe, expect, it } from "vitest";
import { InferenceError } from "../../domain/errors.js";
import { toStatusError } from "./errors.js";

describe("toStatusError", () => {
  it("sends when every upstream of the model comes back, in whole seconds rounded up", () => {
    const err = toStatusError(new InferenceError("upstream_error", "cooled down", undefined, 11_200));
    expect(err).toBeInstanceOf(StatusError);
    expect(err).toMatchObject({
      status: GrpcStatus.UNAVAILABLE,
      code: "upstream_error",
      details: { [INFERENCE_DETAILS.retryAfter]: "12" },
    });
    expect(toStatusError(new InferenceError("upstream_error", "x", undefined, 0))).toMatchObject({
      details: { [INFERENCE_DETAILS.retryAfter]: "1" },
    });
  });

  it("sends no details for a failure with nothing to wait for, and passes other errors through", () => {
    expect(toStatusError(new InferenceError("upstream_timeout", "slow"))).toMatchObject({
      status: GrpcStatus.DEADLINE_EXCEEDED,
      details: {},
    });
    const other = new Error("x");
    expect(toStatusError(other)).toBe(other);
  });
});

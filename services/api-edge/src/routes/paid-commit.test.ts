import { Writable } from "node:stream";
import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { stopDeadline } from "@tollgate/kit/shutdown";
import pino from "pino";
import { describe, expect, it } from "vitest";
import { chargeOf, PaidCommits, receiptWithCharge } from "./paid-commit.js";

const encode = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
const decode = (v: string | undefined) => JSON.parse(Buffer.from(v ?? "", "base64url").toString("utf8"));

/** A hold's receipt as mpp-payment writes it (mppx's session receipt field order). */
const HELD = {
  method: "tempo",
  intent: "session",
  status: "success",
  timestamp: "2026-10-01T12:00:00.000Z",
  reference: "0xabc",
  challengeId: "ch_1",
  channelId: "0xabc",
  acceptedCumulative: "1000000",
  spent: "999000",
  units: 4,
};

describe("the receipt of an answered paid request", () => {
  it("is the hold's receipt with the charge added to spent and one request to units, fields in place", () => {
    const at = new Date("2026-10-01T12:00:05.000Z");
    const receipt = receiptWithCharge(encode(HELD), 1000n, at);
    expect(decode(receipt)).toEqual({
      ...HELD,
      spent: "1000000",
      units: 5,
      timestamp: "2026-10-01T12:00:05.000Z",
    });
    // The same bytes mppx's serializer writes for those figures: JSON in its field order, base64url.
    expect(receipt).toBe(
      encode({ ...HELD, timestamp: "2026-10-01T12:00:05.000Z", spent: "1000000", units: 5 }),
    );
    // Amounts past 2^53 stay exact.
    const big = decode(receiptWithCharge(encode({ ...HELD, spent: "9007199254740993" }), 2n, at));
    expect(big.spent).toBe("9007199254740995");
  });

  it("is undefined for anything but a receipt mpp-payment writes (then Commit's receipt is used)", () => {
    const at = new Date();
    for (const bad of ["", "not base64 json", encode(null), encode({ ...HELD, spent: 5 })]) {
      expect(receiptWithCharge(bad, 1n, at)).toBeUndefined();
    }
    expect(receiptWithCharge(encode({ ...HELD, spent: "-1" }), 1n, at)).toBeUndefined();
    expect(receiptWithCharge(encode({ ...HELD, units: "4" }), 1n, at)).toBeUndefined();
  });

  it("charges the router's cost, never above the quote the hold was taken for", () => {
    expect(chargeOf("120", "500")).toBe(120n);
    expect(chargeOf("900", "500")).toBe(500n);
    expect(chargeOf(undefined, "500")).toBe(0n);
    expect(chargeOf("1.5", "500")).toBe(0n);
  });
});

describe("the commits sent after their answers, at shutdown", () => {
  const capture = () => {
    const lines: Record<string, unknown>[] = [];
    const log = pino(
      new Writable({
        write(chunk, _enc, done) {
          lines.push(JSON.parse(String(chunk)));
          done();
        },
      }),
    );
    return { log, lines };
  };
  const noReplica = () => new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "channel closed");

  it("are waited for until they land", async () => {
    const { log, lines } = capture();
    const commits = new PaidCommits();
    let tries = 0;
    let landed = false;
    commits.send(
      async () => {
        if (++tries < 3) throw noReplica();
        landed = true;
      },
      log,
      "res_landing",
    );
    await commits.settled(stopDeadline(5_000));
    expect(landed).toBe(true);
    expect(lines).toEqual([]);
  });

  it("are left behind, logged by reservation, when mpp-payment stays away past the wait (the whole release stopping)", async () => {
    const { log, lines } = capture();
    const commits = new PaidCommits();
    let away = true;
    commits.send(
      async () => {
        if (away) throw noReplica();
      },
      log,
      "res_stranded",
    );
    const started = Date.now();
    await commits.settled(stopDeadline(300));
    // Not the minute a Commit retries for: the process exits inside its shutdown bound.
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(lines).toMatchObject([
      {
        level: 40,
        reservationId: "res_stranded",
        msg: expect.stringContaining("left to metering's commit"),
      },
    ]);
    // It goes on retrying in the background; once it lands, nothing is left pending.
    away = false;
    await commits.settled(stopDeadline(5_000));
    expect(lines).toHaveLength(1);
  });
});

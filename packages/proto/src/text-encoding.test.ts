import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { getTextEncoding } from "@bufbuild/protobuf/wire";
import { describe, expect, it } from "vitest";
import { UsageRecordedSchema } from "./usage.js";

const TEXTS = [
  "",
  "req_01JXYZABCDEFGHJKMNPQRSTV",
  "caf\u00e9 \u4f60\u597d \u{1f600}",
  "lone \ud800 surrogate",
  "x".repeat(5000),
];

describe("protobuf strings", () => {
  it("are encoded with Node's Buffer once this package is loaded, not a fresh ArrayBuffer each", () => {
    expect(Buffer.isBuffer(getTextEncoding().encodeUtf8("acc_demo"))).toBe(true);
  });

  it("encode to the same bytes as TextEncoder, lone surrogates included", () => {
    const standard = new TextEncoder();
    for (const text of TEXTS) {
      expect(Buffer.from(getTextEncoding().encodeUtf8(text)).equals(Buffer.from(standard.encode(text)))).toBe(
        true,
      );
    }
  });

  it("round-trip a message's strings unchanged", () => {
    const event = create(UsageRecordedSchema, {
      eventId: "evt_\u00e9\u{1f600}",
      accountId: "acc_demo",
      cost: "123",
    });
    const back = fromBinary(UsageRecordedSchema, toBinary(UsageRecordedSchema, event));
    expect([back.eventId, back.accountId, back.cost]).toEqual(["evt_\u00e9\u{1f600}", "acc_demo", "123"]);
  });
});

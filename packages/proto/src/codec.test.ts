import {
  create,
  type DescField,
  type DescMessage,
  fromBinary,
  ScalarType,
  toBinary,
} from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { file_tollgate_auth_v1_auth } from "./auth.js";
import { decodeMessage, encodeMessage, planned, readPlanned, writePlanned } from "./codec.js";
import {
  CompleteRequestSchema,
  Door,
  file_tollgate_inference_v1_cooldown,
  file_tollgate_inference_v1_inference,
  Operation,
  StreamCompleteResponseSchema,
} from "./inference.js";
import { file_tollgate_metering_v1_metering } from "./metering.js";
import { file_tollgate_payment_v1_payment } from "./payment.js";
import { file_tollgate_usage_v1_usage, UsageRecordedSchema } from "./usage.js";

const FILES = [
  file_tollgate_auth_v1_auth,
  file_tollgate_inference_v1_cooldown,
  file_tollgate_inference_v1_inference,
  file_tollgate_metering_v1_metering,
  file_tollgate_payment_v1_payment,
  file_tollgate_usage_v1_usage,
];

function allMessages(list: readonly DescMessage[]): DescMessage[] {
  return list.flatMap((m) => [m, ...allMessages(m.nestedMessages)]);
}
const MESSAGES = allMessages(FILES.flatMap((f) => f.messages));

/** A small deterministic generator, so a failure names a seed that reproduces it. */
function rng(seed: number) {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 0x1_0000_0000;
  };
}

const TEXTS = [
  "",
  "a",
  "req_01JXYZABCDEFGHJKMNPQRSTV",
  "caf\u00e9",
  "\u4f60\u597d\u{1f600}",
  "lone \ud800",
  "x".repeat(300),
];

function scalarValue(t: ScalarType, r: () => number): unknown {
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)]!;
  switch (t) {
    case ScalarType.STRING:
      return pick(TEXTS);
    case ScalarType.BYTES:
      return Uint8Array.from({ length: pick([0, 1, 5, 200]) }, (_, i) => (i * 37) & 0xff);
    case ScalarType.BOOL:
      return r() < 0.5;
    case ScalarType.UINT32:
      return pick([0, 1, 127, 128, 16_383, 16_384, 2_097_152, 0xffff_ffff]);
    case ScalarType.INT32:
      return pick([0, 1, 300, -1, -2_147_483_648, 2_147_483_647]);
    case ScalarType.UINT64:
      return pick([0n, 1n, 300n, (1n << 64n) - 1n]);
    case ScalarType.INT64:
      return pick([0n, 1n, -1n, 1_700_000_000n, -(1n << 63n), (1n << 63n) - 1n]);
    default:
      return 0;
  }
}

function fieldValue(f: DescField, r: () => number, depth: number): unknown {
  switch (f.fieldKind) {
    case "scalar":
      return scalarValue(f.scalar, r);
    case "enum":
      return f.enum.values[Math.floor(r() * f.enum.values.length)]!.number;
    case "message":
      return depth > 3 ? {} : randomInit(f.message, r, depth + 1);
    case "list": {
      const n = Math.floor(r() * 4);
      return Array.from({ length: n }, () =>
        f.listKind === "message"
          ? randomInit(f.message, r, depth + 1)
          : f.listKind === "enum"
            ? f.enum.values[Math.floor(r() * f.enum.values.length)]!.number
            : scalarValue(f.scalar, r),
      );
    }
    default:
      return undefined;
  }
}

/** An init shape with each field left out, set to its zero value or set at random. */
function randomInit(desc: DescMessage, r: () => number, depth = 0): Record<string, unknown> {
  const init: Record<string, unknown> = {};
  for (const f of desc.fields) {
    if (f.oneof) continue;
    if (r() < 0.25) continue;
    init[f.localName] = fieldValue(f, r, depth);
  }
  for (const o of desc.oneofs) {
    const f = o.fields[Math.floor(r() * (o.fields.length + 1))];
    if (f) init[o.localName] = { case: f.localName, value: fieldValue(f, r, depth) };
  }
  return init;
}

const reference = (desc: DescMessage, init: Record<string, unknown>) =>
  Buffer.from(toBinary(desc, create(desc, init as never)));

describe("encodeMessage", () => {
  it("plans every message of this package (none is left whole to protobuf-es)", () => {
    expect(MESSAGES.length).toBeGreaterThan(60);
    expect(MESSAGES.filter((m) => !planned(m)).map((m) => m.typeName)).toEqual([]);
  });

  it("writes every message of this package byte for byte as protobuf-es does, 200 random fills each", () => {
    for (const desc of MESSAGES) {
      for (let seed = 1; seed <= 200; seed++) {
        const init = randomInit(desc, rng(seed * 7919 + desc.typeName.length));
        // The plan writes it itself (no fall-back to protobuf-es hides a mistake).
        const written = writePlanned(desc, init as never);
        expect(written, `${desc.typeName}, seed ${seed}`).toBeDefined();
        const ours = Buffer.from(written!);
        if (!ours.equals(reference(desc, init))) {
          throw new Error(
            `${desc.typeName}, seed ${seed}: ${ours.toString("hex")} != ${reference(desc, init).toString("hex")}`,
          );
        }
        // A full message (what a decode or create gives) encodes the same as its init shape.
        expect(Buffer.from(encodeMessage(desc, create(desc, init as never))).equals(ours)).toBe(true);
      }
    }
  });

  it("writes the request path's messages as they decode back", () => {
    const request = {
      input: {
        requestId: "req_1",
        operation: Operation.CHAT,
        model: "demo-small",
        maxOutputTokens: 0,
        body: Buffer.from('{"model":"demo-small"}'),
        billing: { door: Door.ACCOUNT, accountId: "acme", quote: "123" },
        requireReasoning: false,
      },
    };
    const back = fromBinary(CompleteRequestSchema, encodeMessage(CompleteRequestSchema, request));
    // An optional field set to 0 is present; an implicit false is not written.
    expect(back.input?.maxOutputTokens).toBe(0);
    expect(back.input?.billing?.quote).toBe("123");
    expect(Buffer.from(back.input!.body).toString()).toBe('{"model":"demo-small"}');
    const chunk = { event: { case: "chunk" as const, value: new Uint8Array() } };
    // A oneof's case is written even when its value is empty.
    expect(
      fromBinary(StreamCompleteResponseSchema, encodeMessage(StreamCompleteResponseSchema, chunk)).event.case,
    ).toBe("chunk");
  });

  it("leaves what it does not write to protobuf-es: unknown fields, values of another type", () => {
    const event = create(UsageRecordedSchema, { eventId: "e1", inputTokens: 3 });
    const withUnknown = fromBinary(
      UsageRecordedSchema,
      Buffer.concat([Buffer.from(toBinary(UsageRecordedSchema, event)), Buffer.from([0xf8, 0x06, 0x01])]),
    );
    expect(
      Buffer.from(encodeMessage(UsageRecordedSchema, withUnknown)).equals(
        Buffer.from(toBinary(UsageRecordedSchema, withUnknown)),
      ),
    ).toBe(true);
    // protobuf-es's own answer, whatever it is, for a value the plan does not take.
    const odd = { eventId: "e1", inputTokens: "7" } as never;
    let ours: unknown;
    let theirs: unknown;
    try {
      ours = Buffer.from(encodeMessage(UsageRecordedSchema, odd)).toString("hex");
    } catch (err) {
      ours = String(err);
    }
    try {
      theirs = reference(UsageRecordedSchema, odd).toString("hex");
    } catch (err) {
      theirs = String(err);
    }
    expect(ours).toEqual(theirs);
  });
});

describe("decodeMessage", () => {
  it("reads every message of this package as protobuf-es does, 200 random fills each", () => {
    for (const desc of MESSAGES) {
      for (let seed = 1; seed <= 200; seed++) {
        const bytes = reference(desc, randomInit(desc, rng(seed * 104_729 + desc.typeName.length)));
        const ours = readPlanned(desc, bytes);
        expect(ours, `${desc.typeName}, seed ${seed}`).toBeDefined();
        expect(ours, `${desc.typeName}, seed ${seed}`).toStrictEqual(fromBinary(desc, bytes));
        expect(Object.keys(ours!), desc.typeName).toEqual(Object.keys(fromBinary(desc, bytes)));
      }
    }
  });

  it("reads what it did not write the same way too: unpacked numbers, a field sent twice, unknown fields", () => {
    const usage = Buffer.from(
      toBinary(UsageRecordedSchema, create(UsageRecordedSchema, { eventId: "e1", inputTokens: 3 })),
    );
    const cases = [
      // input_tokens (11) twice: the last one counts.
      Buffer.concat([usage, Buffer.from([0x58, 0x09])]),
      // an unknown field 111 (varint): kept in $unknown by protobuf-es.
      Buffer.concat([usage, Buffer.from([0xf8, 0x06, 0x01])]),
      // occurred_at (2) sent twice: protobuf-es merges the two messages.
      Buffer.concat([usage, Buffer.from([0x12, 0x02, 0x08, 0x05, 0x12, 0x02, 0x10, 0x07])]),
    ];
    for (const bytes of cases) {
      expect(decodeMessage(UsageRecordedSchema, bytes)).toStrictEqual(fromBinary(UsageRecordedSchema, bytes));
    }
  });

  it("answers malformed bytes as protobuf-es does (the same message or the same error)", () => {
    const outcome = (read: () => unknown) => {
      try {
        return read();
      } catch (err) {
        return `threw ${String(err)}`;
      }
    };
    const r = rng(7);
    for (const desc of [CompleteRequestSchema, UsageRecordedSchema, StreamCompleteResponseSchema]) {
      for (let seed = 1; seed <= 300; seed++) {
        const bytes = Buffer.from(reference(desc, randomInit(desc, rng(seed))));
        if (bytes.length === 0) continue;
        // Cut short, or one byte changed.
        const broken =
          seed % 2 === 0
            ? bytes.subarray(0, Math.floor(r() * bytes.length))
            : Buffer.from(
                bytes.map((b, i) =>
                  i === Math.floor(r() * bytes.length) ? b ^ (1 << Math.floor(r() * 8)) : b,
                ),
              );
        expect(
          outcome(() => decodeMessage(desc, broken)),
          `${desc.typeName}, seed ${seed}`,
        ).toStrictEqual(outcome(() => fromBinary(desc, broken)));
      }
    }
  });
});

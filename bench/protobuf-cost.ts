// What protobuf-es costs for the messages of one account-door request (docs/performance.md,
// "What holds the stack back"): each encode or decode run 50,000 times after 5,000 to warm up, in
// one process, µs per call. The body is a 400-character prompt's chat request.
//
//   flock /tmp/bench.lock node --import tsx bench/protobuf-cost.ts
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { decodeMessage, encodeMessage } from "@tollgate/proto/codec";
import { CompleteRequestSchema, CompleteResponseSchema, Door, Operation } from "@tollgate/proto/inference";
import { UsageRecordedSchema } from "@tollgate/proto/usage";

const body = Buffer.from(
  JSON.stringify({
    model: "demo-small",
    max_tokens: 16,
    messages: [{ role: "user", content: "x".repeat(400) }],
  }),
);
const request = {
  input: {
    requestId: "req_01JXYZABCDEFGHJKMNPQRSTV",
    operation: Operation.CHAT,
    model: "demo-small",
    maxOutputTokens: 16,
    body,
    billing: {
      door: Door.ACCOUNT,
      accountId: "acc_bench",
      connectionId: "conn_bench",
      keyId: "key_01JXYZABCDEF",
      reservationId: "lease_01JXYZ:ticket_000123",
      quote: "123456",
    },
  },
};
const usage = {
  inputTokens: 100,
  outputTokens: 16,
  cost: "1234",
  pricingSnapshotId: "snap_1",
  eventId: "evt_01JXYZ",
};
const event = create(UsageRecordedSchema, {
  eventId: "evt_01JXYZABCDEFGH",
  occurredAt: { seconds: 1n, nanos: 5 },
  requestId: "req_01JXYZ",
  accountId: "acc_bench",
  connectionId: "conn_bench",
  keyId: "key_01",
  model: "demo-small",
  runtime: "openai",
  upstreamId: "fake",
  inputTokens: 100,
  outputTokens: 16,
  cost: "1234",
  pricingSnapshotId: "snap_1",
  reservationId: "lease_01:t_1",
});
const encodedRequest = toBinary(CompleteRequestSchema, create(CompleteRequestSchema, request));
const encodedResponse = toBinary(
  CompleteResponseSchema,
  create(CompleteResponseSchema, { body: Buffer.alloc(600, 65), usage }),
);

function time(name: string, f: () => unknown): void {
  for (let i = 0; i < 5_000; i++) f();
  const n = 50_000;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) f();
  console.log(`| ${name} | ${(Number(process.hrtime.bigint() - t0) / n / 1000).toFixed(1)} |`);
}

console.log("| message | µs per call |");
console.log("|---|---:|");
time("CompleteRequest: create + encode (api-edge)", () =>
  toBinary(CompleteRequestSchema, create(CompleteRequestSchema, request)),
);
time("CompleteRequest: decode (router)", () => fromBinary(CompleteRequestSchema, encodedRequest));
time("CompleteResponse: decode (api-edge)", () => fromBinary(CompleteResponseSchema, encodedResponse));
time("UsageRecorded: encode (router)", () => toBinary(UsageRecordedSchema, event));
// What the services call (packages/proto/src/codec.ts): the same bytes from a plan per type.
time("CompleteRequest: encodeMessage (api-edge)", () => encodeMessage(CompleteRequestSchema, request));
time("CompleteResponse: encodeMessage (router)", () =>
  encodeMessage(CompleteResponseSchema, { body: Buffer.alloc(600, 65), usage }),
);
time("CompleteResponse: create + encode (router)", () =>
  toBinary(CompleteResponseSchema, create(CompleteResponseSchema, { body: Buffer.alloc(600, 65), usage })),
);
time("UsageRecorded: encodeMessage (router)", () => encodeMessage(UsageRecordedSchema, event));
time("CompleteRequest: decodeMessage (router)", () => decodeMessage(CompleteRequestSchema, encodedRequest));
time("CompleteResponse: decodeMessage (api-edge)", () =>
  decodeMessage(CompleteResponseSchema, encodedResponse),
);
const encodedEvent = toBinary(UsageRecordedSchema, event);
time("UsageRecorded: decode (metering)", () => fromBinary(UsageRecordedSchema, encodedEvent));
time("UsageRecorded: decodeMessage (metering)", () => decodeMessage(UsageRecordedSchema, encodedEvent));

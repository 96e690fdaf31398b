import { describe, expect, it } from "vitest";
import { parseSse } from "./sse.js";

const encoder = new TextEncoder();

/** The body as the network might deliver it: the UTF-8 bytes cut at the given byte offsets. */
async function* chunked(text: string, cuts: readonly number[]): AsyncGenerator<Uint8Array> {
  const bytes = encoder.encode(text);
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    yield bytes.subarray(from, cut);
    from = cut;
  }
}

async function collect(body: AsyncIterable<Uint8Array>): Promise<string[]> {
  const out: string[] = [];
  for await (const data of parseSse(body)) out.push(data);
  return out;
}

/** Parses `text` cut at every single byte offset, and one byte at a time; all must agree with `expected`. */
async function expectEverySplit(text: string, expected: string[]): Promise<void> {
  const length = encoder.encode(text).length;
  for (let cut = 0; cut <= length; cut++) {
    expect(await collect(chunked(text, [cut])), `cut at byte ${cut}`).toEqual(expected);
  }
  const everyByte = Array.from({ length }, (_, i) => i + 1).slice(0, -1);
  expect(await collect(chunked(text, everyByte)), "one byte at a time").toEqual(expected);
}

describe("parseSse", () => {
  it("tells onBytes of every piece of the body as it is read, before that piece's events", async () => {
    const seen: string[] = [];
    const body = chunked('data: {"a":1}\n\ndata: {"b"', [6, 15]);
    for await (const data of parseSse(body, () => seen.push("bytes"))) seen.push(data);
    expect(seen).toEqual(["bytes", "bytes", '{"a":1}', "bytes"]);
  });

  it("yields one payload per event however the bytes are split (mid-line, mid-'data:')", async () => {
    const text = 'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n';
    await expectEverySplit(text, ['{"a":1}', '{"b":2}', "[DONE]"]);
  });

  it("accepts CRLF line endings, also when CR and LF arrive in different chunks", async () => {
    const text = 'data: {"a":1}\r\n\r\ndata: {"b":2}\r\n\r\n';
    await expectEverySplit(text, ['{"a":1}', '{"b":2}']);
    // The exact awkward cut: right between "\r" and "\n".
    const cr = text.indexOf("\r");
    expect(await collect(chunked(text, [cr + 1]))).toEqual(['{"a":1}', '{"b":2}']);
  });

  it("joins the lines of a multi-line data field with \\n", async () => {
    const text = "data: first\ndata: second\ndata:third\n\n";
    await expectEverySplit(text, ["first\nsecond\nthird"]);
  });

  it("yields a trailing event that has no blank line after it", async () => {
    await expectEverySplit("data: one\n\ndata: two\n", ["one", "two"]);
  });

  it("decodes a multi-byte character cut in the middle of its bytes", async () => {
    const text = 'data: {"t":"héllo 🦊"}\n\n';
    await expectEverySplit(text, ['{"t":"héllo 🦊"}']);
  });

  it("strips exactly one space after the colon and ignores comments and other fields", async () => {
    const text = ": keep-alive\nevent: message\nid: 7\ndata:  two spaces\nretry: 10\n\ndata:none\n\n";
    expect(await collect(chunked(text, []))).toEqual([" two spaces", "none"]);
  });

  it("does not yield events made only of comments or blank lines", async () => {
    expect(await collect(chunked(": ping\n\n\n\n: ping\n\n", [3]))).toEqual([]);
  });
});

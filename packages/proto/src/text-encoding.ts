// How protobuf-es turns strings into UTF-8 and back, for every message of this package.
//
// protobuf-es encodes each string field with the WHATWG `TextEncoder`, whose `encode()` makes a
// fresh ArrayBuffer per call: about 0.75 µs for a 20-character id on Node 24, against 0.07 µs for
// `Buffer.from(text, "utf8")`, which slices Node's shared pool. A usage event carries a dozen
// such strings and every request of the stack encodes several messages, so the encoder is set to
// Node's here (docs/performance.md, "Protobuf strings"). The bytes are the same: both write
// UTF-8 and both replace a lone surrogate with U+FFFD. Decoding and the UTF-8 check stay
// protobuf-es's own (TextDecoder is as fast as Buffer for short strings).
//
// The codec (codec.ts) writes the strings of the messages its plans cover itself; this setting
// serves whatever it hands to protobuf-es.
//
// Every module of this package that re-exports generated code imports this one first, so no
// message of ours is encoded before it ran. Where `Buffer` does not exist (a browser bundle),
// protobuf-es's default is left in place.
import { configureTextEncoding, getTextEncoding } from "@bufbuild/protobuf/wire";

const NodeBuffer = (globalThis as { Buffer?: typeof Buffer }).Buffer;

if (NodeBuffer) {
  const standard = getTextEncoding();
  configureTextEncoding({
    // Node's pool is a plain ArrayBuffer, never a SharedArrayBuffer.
    encodeUtf8: (text: string) => NodeBuffer.from(text, "utf8") as Uint8Array<ArrayBuffer>,
    decodeUtf8: standard.decodeUtf8,
    checkUtf8: standard.checkUtf8,
  });
}

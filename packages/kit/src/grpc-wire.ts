// gRPC's wire format over HTTP/2, shared by the gateway's client channel (channel.ts) and its
// server (grpc-server.ts): length-prefixed messages, `grpc-timeout`, `grpc-message`.
import { status } from "@grpc/grpc-js";
import { RemoteError } from "./remote-error.js";

/** The largest message a call takes, either way (clients and servers keep the same limit). */
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

/** Reads a gRPC message stream (1 byte compressed flag, 4 bytes length, the message) from chunks. */
export class FrameReader {
  #pending: Buffer[] = [];
  #pendingBytes = 0;

  /** Bytes received that do not make a whole message yet. */
  get pendingBytes(): number {
    return this.#pendingBytes;
  }

  /** The whole messages `chunk` completes; throws RemoteError on a message it cannot take. */
  push(chunk: Buffer): Buffer[] {
    this.#pending.push(chunk);
    this.#pendingBytes += chunk.length;
    const out: Buffer[] = [];
    for (;;) {
      if (this.#pendingBytes < 5) return out;
      if (this.#pending.length > 1) this.#pending = [Buffer.concat(this.#pending)];
      const buf = this.#pending[0]!;
      if (buf[0] !== 0) throw new RemoteError(status.INTERNAL, undefined, "compressed message not asked for");
      const length = buf.readUInt32BE(1);
      if (length > MAX_MESSAGE_BYTES) {
        throw new RemoteError(
          status.RESOURCE_EXHAUSTED,
          undefined,
          `received message larger than max (${length} vs ${MAX_MESSAGE_BYTES})`,
        );
      }
      if (this.#pendingBytes < 5 + length) return out;
      out.push(buf.subarray(5, 5 + length));
      const rest = buf.subarray(5 + length);
      this.#pending = rest.length > 0 ? [rest] : [];
      this.#pendingBytes = rest.length;
    }
  }
}

/**
 * A `grpc-timeout` header for `ms` from now: at most 8 digits, in milliseconds while they fit,
 * else in seconds.
 */
export function grpcTimeout(ms: number): string {
  const whole = Math.max(1, Math.ceil(ms));
  return whole < 1e8 ? `${whole}m` : `${Math.min(99_999_999, Math.ceil(whole / 1000))}S`;
}

const TIMEOUT_UNIT_MS: Readonly<Record<string, number>> = {
  H: 3_600_000,
  M: 60_000,
  S: 1_000,
  m: 1,
  u: 0.001,
  n: 0.000_001,
};

/** Milliseconds a `grpc-timeout` header allows; undefined when absent or not one. */
export function parseGrpcTimeout(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const m = /^(\d{1,8})([HMSmun])$/.exec(value);
  if (!m) return undefined;
  return Number(m[1]) * TIMEOUT_UNIT_MS[m[2]!]!;
}

/** The 5-byte prefix and the message, as one buffer. */
export function frame(message: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(5 + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  out.set(message, 5);
  return out;
}

/**
 * A status message as `grpc-message` carries it: percent-encoded outside printable ASCII
 * (and `%` itself), so any text survives a header.
 */
export function encodeGrpcMessage(message: string): string {
  let plain = true;
  for (let i = 0; i < message.length; i++) {
    const c = message.charCodeAt(i);
    if (c < 0x20 || c > 0x7e || c === 0x25) {
      plain = false;
      break;
    }
  }
  if (plain) return message;
  let out = "";
  for (const byte of Buffer.from(message, "utf8")) {
    out +=
      byte < 0x20 || byte > 0x7e || byte === 0x25
        ? `%${byte.toString(16).toUpperCase().padStart(2, "0")}`
        : String.fromCharCode(byte);
  }
  return out;
}

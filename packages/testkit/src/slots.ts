import type { Redis } from "@tollgate/kit/redis";
import { Cluster } from "ioredis";

const CRC16_TABLE = (() => {
  const table = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let crc = i << 8;
    for (let b = 0; b < 8; b++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    table[i] = crc;
  }
  return table;
})();

/** CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with. */
function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ byte) & 0xff]!;
  return crc;
}

/**
 * The Redis Cluster slot of a key: CRC16 of the key, or of its hash tag (what lies between the
 * first `{` and the next `}`, when that is not empty), modulo 16384.
 */
export function keySlot(key: string): number {
  const open = key.indexOf("{");
  if (open >= 0) {
    const close = key.indexOf("}", open + 1);
    if (close > open + 1) key = key.slice(open + 1, close);
  }
  return crc16(Buffer.from(key, "utf8")) % 16384;
}

/** One multi-key operation a store sent: a script, an EVAL, a pipeline, a MULTI or an MGET. */
export interface KeyedCall {
  kind: "script" | "eval" | "pipeline" | "multi" | "command";
  /** The script's (or command's) name; a pipeline's or MULTI's commands joined by ",". */
  name: string;
  keys: string[];
}

/** Commands whose every argument is a key; any other command's key is its first argument. */
const ALL_KEYS = new Set(["mget", "del", "unlink", "exists", "touch"]);

/**
 * A stand-in for a Redis Cluster connection that runs nothing: it records the keys of every
 * script, EVAL, pipeline, MULTI and command a store sends (so a test can check that each lands
 * in one slot) and answers each with `reply(name, args)`. It is an `instanceof Cluster`, so the
 * stores lay their keys out as they do on a real cluster.
 */
export function slotRecorder(reply: (name: string, args: unknown[]) => unknown = () => null): {
  redis: Redis;
  calls: KeyedCall[];
} {
  const calls: KeyedCall[] = [];
  const scripts = new Map<string, number | undefined>();
  const prototype = Cluster.prototype as unknown as Record<string, unknown>;
  const isCommand = (name: string) => typeof prototype[name] === "function";
  const keysOf = (name: string, args: unknown[]) =>
    (ALL_KEYS.has(name) ? args.flat() : args.slice(0, 1)).map(String);

  const batch = (kind: "pipeline" | "multi") => {
    const names: string[] = [];
    const keys: string[] = [];
    const replies: unknown[] = [];
    const proxy: unknown = new Proxy(
      {},
      {
        get(_, prop) {
          if (prop === "exec")
            return async () => {
              calls.push({ kind, name: names.join(","), keys });
              return replies.map((r) => [null, r]);
            };
          if (typeof prop === "string" && scripts.has(prop))
            return (...args: unknown[]) => {
              const fixed = scripts.get(prop);
              const rest = fixed === undefined ? args.slice(1) : args;
              const n = fixed ?? Number(args[0]);
              names.push(prop);
              keys.push(...rest.slice(0, n).map(String));
              replies.push(reply(prop, rest.slice(n)));
              return proxy;
            };
          if (typeof prop !== "string" || !isCommand(prop)) return undefined;
          return (...args: unknown[]) => {
            names.push(prop);
            keys.push(...keysOf(prop, args));
            replies.push(reply(prop, args));
            return proxy;
          };
        },
      },
    );
    return proxy;
  };

  const redis = new Proxy(Object.create(Cluster.prototype) as object, {
    get(_, prop) {
      if (typeof prop !== "string") return undefined;
      if (prop === "status") return "ready";
      if (prop === "defineCommand")
        return (name: string, def: { numberOfKeys?: number }) => scripts.set(name, def.numberOfKeys);
      if (scripts.has(prop))
        return async (...args: unknown[]) => {
          const fixed = scripts.get(prop);
          const n = fixed ?? Number(args.shift());
          calls.push({ kind: "script", name: prop, keys: args.slice(0, n).map(String) });
          return reply(prop, args.slice(n));
        };
      if (prop === "eval" || prop === "evalsha")
        return async (script: string, n: number, ...args: unknown[]) => {
          calls.push({
            kind: "eval",
            name: script.trim().split("\n")[0] ?? "",
            keys: args.slice(0, n).map(String),
          });
          return reply(prop, args.slice(n));
        };
      if (prop === "pipeline" || prop === "multi") return () => batch(prop);
      if (!isCommand(prop)) return undefined;
      return async (...args: unknown[]) => {
        calls.push({ kind: "command", name: prop, keys: keysOf(prop, args) });
        return reply(prop, args);
      };
    },
  }) as Redis;
  return { redis, calls };
}

/** The calls whose keys span more than one slot (a real cluster refuses them with CROSSSLOT). */
export function crossSlot(calls: readonly KeyedCall[]): KeyedCall[] {
  return calls.filter((c) => new Set(c.keys.map(keySlot)).size > 1);
}

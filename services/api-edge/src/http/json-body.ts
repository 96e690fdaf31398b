import { isUtf8 } from "node:buffer";
import type { FastifyInstance } from "fastify";

/** The ways a body can be refused before any route sees it. */
export type BodyErrorCode = "invalid_json" | "json_too_deep" | "unsupported_media_type";

/** Why a JSON text is refused although it may parse: too deep, or a key that is ambiguous or unsafe. */
export interface JsonProblem {
  code: "invalid_json" | "json_too_deep";
  message: string;
}

interface Frame {
  /** An object's keys so far; undefined for an array. */
  keys: Set<string> | undefined;
  expectKey: boolean;
  lastKey: string | undefined;
  /** The key this container is the value of, in its parent object. */
  parentKey: string | undefined;
}

/**
 * One linear pass over a JSON text, before it is parsed: refuses nesting deeper than `maxDepth`
 * (parsing and re-serialising a deep document costs CPU and stack), duplicate keys (JSON.parse
 * keeps the last one while the upstream, which receives the bytes as sent, may keep the first),
 * `__proto__` keys and `constructor.prototype` (prototype poisoning, as fastify's own parser
 * refuses them). Messages never quote the body. Text that is not JSON at all is left to
 * JSON.parse to refuse: this pass only has to be right about valid JSON.
 */
export function inspectJson(text: string, maxDepth: number): JsonProblem | undefined {
  const stack: Frame[] = [];
  const n = text.length;
  let i = 0;
  while (i < n) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      let end = text.indexOf('"', i + 1);
      // Skip quotes escaped by an odd run of backslashes.
      while (end !== -1) {
        let slashes = 0;
        for (let k = end - 1; text.charCodeAt(k) === 0x5c; k--) slashes++;
        if (slashes % 2 === 0) break;
        end = text.indexOf('"', end + 1);
      }
      if (end === -1) return undefined;
      const top = stack[stack.length - 1];
      if (top?.keys && top.expectKey) {
        const raw = text.slice(i + 1, end);
        let key = raw;
        if (raw.includes("\\")) {
          try {
            key = JSON.parse(`"${raw}"`) as string;
          } catch {
            return undefined;
          }
        }
        if (key === "__proto__" || (key === "prototype" && top.parentKey === "constructor")) {
          return { code: "invalid_json", message: "the request body uses a reserved key (__proto__)" };
        }
        if (top.keys.has(key)) {
          return { code: "invalid_json", message: "the request body has a duplicate key in one object" };
        }
        top.keys.add(key);
        top.expectKey = false;
        top.lastKey = key;
      }
      i = end + 1;
      continue;
    }
    if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      if (stack.length >= maxDepth) {
        return { code: "json_too_deep", message: `the request body nests deeper than ${maxDepth} levels` };
      }
      const parent = stack[stack.length - 1];
      stack.push({
        keys: c === 0x7b ? new Set() : undefined,
        expectKey: c === 0x7b,
        lastKey: undefined,
        parentKey: parent?.keys ? parent.lastKey : undefined,
      });
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      stack.pop();
    } else if (c === 0x2c /* , */) {
      const top = stack[stack.length - 1];
      if (top?.keys) top.expectKey = true;
    }
    i++;
  }
  return undefined;
}

/**
 * Reads a JSON body: UTF-8 only (the bytes are forwarded as received, so they must mean what
 * was validated), inspected (inspectJson) before parsing. Resolves the parsed value, or throws
 * the problem. An empty body parses as undefined.
 */
export function parseJsonBody(body: Buffer, maxDepth: number): { value: unknown } | JsonProblem {
  if (body.length === 0) return { value: undefined };
  if (!isUtf8(body)) return { code: "invalid_json", message: "the request body is not valid UTF-8" };
  const text = body.toString("utf8");
  const problem = inspectJson(text, maxDepth);
  if (problem) return problem;
  try {
    return { value: JSON.parse(text) };
  } catch {
    return { code: "invalid_json", message: "the request body is not valid JSON" };
  }
}

/** Body refusals held back until the route has checked the caller (acceptJsonOnly's `refuseIn`). */
const heldRefusals = new WeakMap<object, Error>();

/**
 * The refusal of this request's body, when acceptJsonOnly held it back for the route (a body
 * that is not JSON, too deep, compressed or of another type); undefined for a body it read.
 */
export function bodyRefusal(req: object): Error | undefined {
  return heldRefusals.get(req);
}

/**
 * Accepts only `application/json` bodies on `app`: keeps the exact bytes as `req.rawBody`
 * (forwarded as received and, on the paid door, digested), parses them (parseJsonBody), and
 * refuses anything else with the boundary's own error class. With `refuseIn: "route"` a refusal
 * is not answered here: the body reads as undefined and the route takes the refusal from
 * bodyRefusal once it has checked the caller, so a bad key gets its 401 whatever the body holds
 * (docs/contract.md, "Authentication"). A body over the size limit is still a 413 here: it is
 * refused before it is read.
 */
export function acceptJsonOnly(
  app: FastifyInstance,
  maxDepth: number,
  error: (code: BodyErrorCode, message: string) => Error,
  { refuseIn = "parser" }: { refuseIn?: "parser" | "route" } = {},
): void {
  const refuse = (req: object, err: Error, done: (err: Error | null, body?: unknown) => void) => {
    if (refuseIn === "parser") return done(err, undefined);
    heldRefusals.set(req, err);
    done(null, undefined);
  };
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (req, body: Buffer, done) => {
    // A compressed body is not read as JSON (and not digested as the bytes it stands for): 415,
    // the status HTTP gives an unsupported Content-Encoding, not a misleading invalid_json.
    // So is a body in a transfer coding beside chunked (`gzip, chunked`): Node removes the
    // chunked framing only, and the bytes left are not the JSON they stand for.
    const encoding = req.headers["content-encoding"];
    const transfer = req.headers["transfer-encoding"];
    if (
      (encoding !== undefined && encoding.trim().toLowerCase() !== "identity") ||
      (transfer !== undefined && transfer.trim().toLowerCase() !== "chunked")
    ) {
      return refuse(
        req,
        error(
          "unsupported_media_type",
          "send the body uncompressed: Content-Encoding and transfer codings other than chunked are not supported",
        ),
        done,
      );
    }
    const parsed = parseJsonBody(body, maxDepth);
    if (!("value" in parsed)) return refuse(req, error(parsed.code, parsed.message), done);
    req.rawBody = body;
    done(null, parsed.value);
  });
  // Read to its end (within the body limit; above it 413) before the 415: fastify closes the
  // connection after a refused body, and closing on unread bytes resets it, so a caller still
  // writing would meet EPIPE or a reset instead of the answer.
  app.addContentTypeParser("*", { parseAs: "buffer" }, (req, _body, done) =>
    refuse(req, error("unsupported_media_type", "send the body as Content-Type: application/json"), done),
  );
}

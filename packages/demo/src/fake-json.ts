// The fake upstream's answer to a chat `response_format` asking for JSON (fake-upstream.ts): a
// small deterministic JSON text, and how it is cut into tokens.

/** Characters (code points) of JSON per output token: each is one streamed chunk. */
const JSON_TOKEN_CHARS = 4;
/** Nesting (and `$ref` hops) followed before a value is left null. */
const MAX_DEPTH = 16;

type JsonObject = Record<string, unknown>;

const isObject = (v: unknown): v is JsonObject => typeof v === "object" && v !== null && !Array.isArray(v);

/** Why a `response_format` is refused (a 400 from the fake), or undefined when it is fine. */
export class ResponseFormatError extends Error {}

/**
 * The JSON text a chat request's `response_format` asks for, or undefined for text (absent, null
 * or `{ type: "text" }`): for `json_object` `{"answer":"<word>"}`, for `json_schema` the minimal
 * instance of its schema (minimalInstance). `word` names the string for a property (its name,
 * "answer" at the top level of a JSON object). Throws ResponseFormatError for any other format.
 */
export function jsonAnswerOf(responseFormat: unknown, word: (key: string) => string): string | undefined {
  if (responseFormat === undefined || responseFormat === null) return undefined;
  const type = isObject(responseFormat) ? responseFormat["type"] : undefined;
  if (type === "text") return undefined;
  if (type === "json_object") return JSON.stringify({ answer: word("answer") });
  if (type === "json_schema") {
    const spec = (responseFormat as JsonObject)["json_schema"];
    if (!isObject(spec)) throw new ResponseFormatError("response_format.json_schema must be an object");
    const schema = spec["schema"] ?? {};
    if (!isObject(schema))
      throw new ResponseFormatError("response_format.json_schema.schema must be an object");
    return JSON.stringify(minimalInstance(schema, word) ?? {});
  }
  throw new ResponseFormatError("response_format.type must be one of text, json_object, json_schema");
}

/**
 * A small value `schema` accepts, the same every time: `const` or the first of `enum`; the first
 * option of `anyOf`, `oneOf` or `allOf`; a local `$ref` followed; an object with its `required`
 * properties; strings `word(property name)`, numbers 0, booleans false, arrays empty, and the
 * first type of a type list that is not "null". Bounds (minimum, minLength, minItems, pattern)
 * are not honoured.
 */
export function minimalInstance(schema: JsonObject, word: (key: string) => string): unknown {
  const instance = (s: unknown, key: string, depth: number): unknown => {
    if (!isObject(s) || depth > MAX_DEPTH) return null;
    if ("const" in s) return s["const"];
    const enumValues = s["enum"];
    if (Array.isArray(enumValues) && enumValues.length > 0) return enumValues[0];
    const ref = s["$ref"];
    if (typeof ref === "string") return instance(resolveRef(schema, ref), key, depth + 1);
    for (const combinator of ["anyOf", "oneOf", "allOf"]) {
      const options = s[combinator];
      if (Array.isArray(options) && options.length > 0) return instance(options[0], key, depth + 1);
    }
    const types = Array.isArray(s["type"]) ? s["type"] : [s["type"]];
    const type = types.find((t) => t !== "null") ?? types[0];
    const properties = isObject(s["properties"]) ? s["properties"] : undefined;
    switch (type ?? (properties ? "object" : undefined)) {
      case "object": {
        const required = Array.isArray(s["required"]) ? s["required"] : [];
        const out: JsonObject = {};
        for (const [name, sub] of Object.entries(properties ?? {})) {
          if (required.includes(name)) out[name] = instance(sub, name, depth + 1);
        }
        return out;
      }
      case "string":
        return word(key);
      case "number":
      case "integer":
        return 0;
      case "boolean":
        return false;
      case "array":
        return [];
      default:
        return null;
    }
  };
  return instance(schema, "answer", 0);
}

/** The schema a local reference (`#`, `#/$defs/x`, `#/definitions/x`) names inside `root`. */
function resolveRef(root: JsonObject, ref: string): unknown {
  if (ref !== "#" && !ref.startsWith("#/")) return undefined;
  let at: unknown = root;
  for (const raw of ref.split("/").slice(1)) {
    const key = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
    at = isObject(at) ? at[key] : Array.isArray(at) ? at[Number(key)] : undefined;
  }
  return at;
}

/** A JSON answer's tokens: pieces of JSON_TOKEN_CHARS code points, each streamed as one chunk. */
export function jsonTokens(text: string): string[] {
  const chars = Array.from(text);
  const pieces: string[] = [];
  for (let i = 0; i < chars.length; i += JSON_TOKEN_CHARS) {
    pieces.push(chars.slice(i, i + JSON_TOKEN_CHARS).join(""));
  }
  return pieces;
}

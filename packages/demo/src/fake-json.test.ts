import { describe, expect, it } from "vitest";
import { jsonAnswerOf, jsonTokens, minimalInstance, ResponseFormatError } from "./fake-json.js";

const word = (key: string) => `w-${key}`;

describe("minimalInstance", () => {
  it("fills an object's required properties, in their order, with the smallest value of each type", () => {
    const schema = {
      type: "object",
      properties: {
        name: { type: "string" },
        optional: { type: "string" },
        age: { type: "integer" },
        score: { type: "number" },
        ok: { type: "boolean" },
        tags: { type: "array", items: { type: "string" } },
        kind: { type: "string", enum: ["first", "second"] },
        fixed: { const: 7 },
        maybe: { type: ["null", "string"] },
        nothing: { type: "null" },
        nested: { type: "object", properties: { inner: { type: "number" } }, required: ["inner"] },
      },
      required: ["name", "age", "score", "ok", "tags", "kind", "fixed", "maybe", "nothing", "nested"],
      additionalProperties: false,
    };
    expect(minimalInstance(schema, word)).toEqual({
      name: "w-name",
      age: 0,
      score: 0,
      ok: false,
      tags: [],
      kind: "first",
      fixed: 7,
      maybe: "w-maybe",
      nothing: null,
      nested: { inner: 0 },
    });
  });

  it("takes the first option of anyOf, oneOf and allOf, and follows local references", () => {
    const schema = {
      type: "object",
      properties: {
        a: { anyOf: [{ type: "number" }, { type: "string" }] },
        b: { oneOf: [{ type: "boolean" }] },
        c: { $ref: "#/$defs/point" },
        d: { $ref: "#/definitions/a~1b" },
      },
      required: ["a", "b", "c", "d"],
      $defs: { point: { type: "object", properties: { x: { type: "number" } }, required: ["x"] } },
      definitions: { "a/b": { type: "string" } },
    };
    expect(minimalInstance(schema, word)).toEqual({ a: 0, b: false, c: { x: 0 }, d: "w-d" });
  });

  it("ends a recursive schema with null instead of looping", () => {
    const schema = {
      type: "object",
      properties: { next: { $ref: "#" } },
      required: ["next"],
    };
    const text = JSON.stringify(minimalInstance(schema, word));
    expect(text.startsWith('{"next":{"next":')).toBe(true);
    expect(text).toContain("null");
  });
});

describe("jsonAnswerOf", () => {
  it("answers text formats with nothing, json_object with an object, json_schema with its instance", () => {
    expect(jsonAnswerOf(undefined, word)).toBeUndefined();
    expect(jsonAnswerOf(null, word)).toBeUndefined();
    expect(jsonAnswerOf({ type: "text" }, word)).toBeUndefined();
    expect(jsonAnswerOf({ type: "json_object" }, word)).toBe('{"answer":"w-answer"}');
    const schema = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
    expect(jsonAnswerOf({ type: "json_schema", json_schema: { name: "x", schema } }, word)).toBe(
      '{"city":"w-city"}',
    );
    expect(jsonAnswerOf({ type: "json_schema", json_schema: { name: "x" } }, word)).toBe("{}");
  });

  it("refuses a format it does not know or a json_schema without its object", () => {
    for (const format of [
      { type: "xml" },
      "json",
      { type: "json_schema" },
      { type: "json_schema", json_schema: { schema: [] } },
    ]) {
      expect(() => jsonAnswerOf(format, word)).toThrow(ResponseFormatError);
    }
  });
});

describe("jsonTokens", () => {
  it("cuts a JSON text into pieces of four code points, the last shorter", () => {
    expect(jsonTokens('{"answer":"é😀"}')).toEqual(['{"an', "swer", '":"é', '😀"}']);
    expect(jsonTokens("{}")).toEqual(["{}"]);
  });
});

// What both OpenAPI documents (public and admin) are made of: JSON Schemas converted from the
// zod schemas the routes validate with, the error codes of the error table, and the document
// types. Pure: no fastify, no file system.

import { ERRORS, type ErrorDoor } from "@tollgate/proto/errors";
import { z } from "zod";

/** A JSON Schema (draft 2020-12, the dialect of OpenAPI 3.1). */
export type JsonSchema = Record<string, unknown>;

export interface Operation {
  operationId: string;
  summary: string;
  description?: string;
  tags?: string[];
  security?: Record<string, string[]>[];
  parameters?: unknown[];
  requestBody?: unknown;
  responses: Record<string, unknown>;
  [extension: `x-${string}`]: unknown;
}

export type PathItem = Partial<Record<"get" | "post" | "put" | "patch" | "delete", Operation>>;

export interface OpenApiDocument {
  openapi: "3.1.0";
  info: {
    title: string;
    version: string;
    license: { name: string; identifier: string };
    description: string;
  };
  servers: { url: string }[];
  security: Record<string, string[]>[];
  paths: Record<string, PathItem>;
  components: {
    securitySchemes: Record<string, unknown>;
    parameters?: Record<string, unknown>;
    responses: Record<string, unknown>;
    schemas: Record<string, JsonSchema>;
  };
}

/** The version both documents carry: api-edge's. */
const API_VERSION = "0.1.0";

const LICENSE = { name: "Apache-2.0", identifier: "Apache-2.0" };

/**
 * Schemas a document names: each one registered in `registry` with an id is written once, in
 * `schemas` (the document's `components.schemas`), and referenced wherever it is used.
 */
export interface NamedSchemas {
  registry: z.core.$ZodRegistry<{ id: string }>;
  schemas: Record<string, JsonSchema>;
}

/** zod's local `$defs` references as the document's components. */
const asComponents = <T>(schema: T): T =>
  JSON.parse(JSON.stringify(schema).replaceAll('"#/$defs/', '"#/components/schemas/')) as T;

/**
 * The JSON Schema of what a zod schema accepts (its input side: a field with a default or a
 * transform is described as the caller sends it). Refinements (`superRefine`) have no JSON
 * Schema form; the route's own messages describe them, so they are left to the descriptions.
 * Without `named` every part is written in place: a `$defs` inside an OpenAPI document would
 * resolve against the document, not the schema.
 */
export function jsonSchemaOf(schema: z.ZodType, named?: NamedSchemas): JsonSchema {
  const {
    $schema: _dialect,
    $defs,
    ...rest
  } = z.toJSONSchema(schema, {
    target: "draft-2020-12",
    io: "input",
    reused: "inline",
    unrepresentable: "any",
    ...(named ? { metadata: named.registry } : {}),
  });
  for (const [id, def] of Object.entries($defs ?? {})) {
    if (named) named.schemas[id] = asComponents(def) as JsonSchema;
  }
  return asComponents(rest);
}

/** fastify's `:name` as OpenAPI's `{name}`. */
export function openApiPath(path: string): string {
  return path.replace(/:([A-Za-z]+)/g, "{$1}");
}

/** The path parameters of a fastify path, each a required string. */
export function pathParameters(path: string): unknown[] {
  return [...path.matchAll(/:([A-Za-z]+)/g)].map(([, name]) => ({
    name,
    in: "path",
    required: true,
    schema: { type: "string" },
  }));
}

/** The codes of the error table (packages/proto/src/errors.ts) a door answers, in table order. */
export function errorCodes(doors: readonly ErrorDoor[]): string[] {
  return Object.entries(ERRORS)
    .filter(([, spec]) => spec.doors.some((d) => doors.includes(d)))
    .map(([code]) => code);
}

/** A required JSON request body of this schema. */
export function jsonBody(schema: z.ZodType): unknown {
  return { required: true, content: { "application/json": { schema: jsonSchemaOf(schema) } } };
}

/** The error body both ports answer: `{ error: { message, type, code, request_id } }`. */
export function errorSchema(code: z.ZodType) {
  return z.object({
    error: z.object({ message: z.string(), type: z.string(), code, request_id: z.string() }),
  });
}

/** Adds an operation at its method and fastify path. */
export function addOperation(
  paths: Record<string, PathItem>,
  method: string,
  path: string,
  op: Operation,
): void {
  const at = openApiPath(path);
  paths[at] = { ...paths[at], [method.toLowerCase()]: op };
}

/** What tells the two documents apart; the rest (version, license, the Error response) is shared. */
export interface DocumentParts {
  title: string;
  description: string;
  security: Record<string, string[]>[];
  paths: Record<string, PathItem>;
  components: Omit<OpenApiDocument["components"], "responses">;
}

/** An OpenAPI 3.1 document of these parts; its `Error` response is the `Error` schema. */
export function openApiDocument(parts: DocumentParts): OpenApiDocument {
  return {
    openapi: "3.1.0",
    info: { title: parts.title, version: API_VERSION, license: LICENSE, description: parts.description },
    // Relative: the paths are on the host and port that served the document, wherever it runs.
    servers: [{ url: "/" }],
    security: parts.security,
    paths: parts.paths,
    components: {
      ...parts.components,
      responses: {
        Error: {
          description: "An error; `error.code` names it.",
          content: { "application/json": { schema: { $ref: "#/components/schemas/Error" } } },
        },
      },
    },
  };
}

/** A response whose body is a named component schema. */
export function jsonResponse(description: string, ref: string): unknown {
  return {
    description,
    content: { "application/json": { schema: { $ref: `#/components/schemas/${ref}` } } },
  };
}

/** The document's bytes as served: JSON, built once. */
export function documentBytes(doc: OpenApiDocument): Buffer {
  return Buffer.from(JSON.stringify(doc));
}

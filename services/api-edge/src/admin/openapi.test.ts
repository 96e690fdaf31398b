import { readFileSync } from "node:fs";
import { ERRORS } from "@tollgate/proto/errors";
import { OPERATION_NAMES, ROUTES } from "@tollgate/proto/routes";
import { describe, expect, it } from "vitest";
import { parse } from "yaml";

const root = new URL("../../../../", import.meta.url);
const read = (path: string) => readFileSync(new URL(path, root), "utf8");

interface OpenApi {
  openapi: string;
  paths: Record<string, Record<string, unknown>>;
  components: { schemas: Record<string, { enum?: string[] }> };
}

const METHODS = ["get", "post", "put", "patch", "delete"];

/** "GET /v1/models/{model}" for every operation of a document. */
function operations(doc: OpenApi): string[] {
  return Object.entries(doc.paths)
    .flatMap(([path, item]) =>
      Object.keys(item)
        .filter((m) => METHODS.includes(m))
        .map((m) => `${m.toUpperCase()} ${path}`),
    )
    .sort();
}

/** fastify's `:name` as OpenAPI's `{name}`. */
const openApiPath = (path: string) => path.replace(/:([A-Za-z]+)/g, "{$1}");

const publicDoc = parse(read("docs/openapi/public.yaml")) as OpenApi;
const adminDoc = parse(read("docs/openapi/admin.yaml")) as OpenApi;

describe("docs/openapi", () => {
  it("are OpenAPI 3.1 documents", () => {
    expect(publicDoc.openapi).toBe("3.1.0");
    expect(adminDoc.openapi).toBe("3.1.0");
  });

  it("public.yaml documents exactly the routes of the public route table", () => {
    const table = Object.values(ROUTES)
      .map((r) => `${r.method} ${openApiPath(r.path)}`)
      .sort();
    expect(operations(publicDoc)).toEqual(table);
  });

  it("admin.yaml documents exactly the routes the admin server registers", () => {
    const source = readFileSync(new URL("./server.ts", import.meta.url), "utf8");
    const registered = [...source.matchAll(/app\.(get|post|put|patch|delete)(?:<\w+>)?\(\s*"([^"]+)"/g)]
      .map(([, method, path]) => `${method!.toUpperCase()} ${openApiPath(path!)}`)
      .sort();
    expect(registered.length).toBeGreaterThan(10);
    expect(operations(adminDoc)).toEqual(registered);
  });

  it("every $ref points at a component that exists", () => {
    for (const doc of [publicDoc, adminDoc]) {
      const refs = [...JSON.stringify(doc).matchAll(/"\$ref":"#\/components\/(\w+)\/(\w+)"/g)];
      expect(refs.length).toBeGreaterThan(5);
      for (const [ref, kind, name] of refs) {
        const group = (doc.components as unknown as Record<string, Record<string, unknown>>)[kind!];
        expect(group?.[name!], ref).toBeDefined();
      }
    }
  });

  it("the public error schema names every code of the error table, and nothing else", () => {
    expect([...(publicDoc.components.schemas["ErrorCode"]?.enum ?? [])].sort()).toEqual(
      Object.keys(ERRORS).sort(),
    );
  });

  it("the admin document's route names are the operations of the route table", () => {
    expect([...(adminDoc.components.schemas["RouteName"]?.enum ?? [])].sort()).toEqual(
      [...OPERATION_NAMES].sort(),
    );
  });
});

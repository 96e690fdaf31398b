/**
 * Every public HTTP route of api-edge, once: its method and path, its door, the operation it
 * performs (the name policy, per-route rate limits, metrics, usage and the admin API use), whether
 * it streams and which request schema reads its body. api-edge registers its routes and answers
 * 405s from this table; configuration, auth-policy, the admin API and tollgatectl take their
 * route names from OPERATIONS; a test checks the docs' route tables against it
 * (docs/how-to/add-a-route.md).
 */
import { Route } from "./gen/tollgate/auth/v1/auth_pb.js";

/**
 * The account-door operations by name, each with its auth contract `Route` value: the names a
 * connection's `routes` and per-route `limits` use, and the label of auth-policy's metrics.
 */
export const OPERATIONS = {
  models: Route.MODELS,
  chat: Route.CHAT_COMPLETIONS,
  completions: Route.COMPLETIONS,
  responses: Route.RESPONSES,
  think: Route.THINK,
  embeddings: Route.EMBEDDINGS,
} as const satisfies Record<string, Route>;

export type OperationName = keyof typeof OPERATIONS;

/** The operation names, in table order. */
export const OPERATION_NAMES = Object.keys(OPERATIONS) as [OperationName, ...OperationName[]];

const NAME_BY_ROUTE: ReadonlyMap<Route, OperationName> = new Map(
  OPERATION_NAMES.map((name) => [OPERATIONS[name], name]),
);

/** The operation name of an auth contract `Route` value; undefined for UNSPECIFIED or a newer value. */
export function operationOf(route: Route): OperationName | undefined {
  return NAME_BY_ROUTE.get(route);
}

/** Who may call a route: a Virtual Key (account), a payment (paid), or anyone (public: probes, the API document). */
export type RouteDoor = "account" | "paid" | "public";

export type HttpMethod = "GET" | "POST";

/** The request schemas api-edge keeps (services/api-edge/src/schemas/requests.ts). */
export type RequestSchemaKey =
  | "chat"
  | "paidChat"
  | "completion"
  | "responses"
  | "messages"
  | "think"
  | "embeddings";

export interface RouteSpec {
  readonly method: HttpMethod;
  /** The path template as fastify spells it (`:name` for a parameter). */
  readonly path: string;
  readonly door: RouteDoor;
  /** The operation it performs; null for the probes, which no policy names. */
  readonly operation: OperationName | null;
  /** The body may ask for `stream: true` (answered as SSE). */
  readonly streams: boolean;
  /** The request schema of its body; null when it takes none. */
  readonly schema: RequestSchemaKey | null;
}

export const ROUTES = {
  models: {
    method: "GET",
    path: "/v1/models",
    door: "account",
    operation: "models",
    streams: false,
    schema: null,
  },
  model: {
    method: "GET",
    path: "/v1/models/:model",
    door: "account",
    operation: "models",
    streams: false,
    schema: null,
  },
  chat: {
    method: "POST",
    path: "/v1/chat/completions",
    door: "account",
    operation: "chat",
    streams: true,
    schema: "chat",
  },
  completions: {
    method: "POST",
    path: "/v1/completions",
    door: "account",
    operation: "completions",
    streams: true,
    schema: "completion",
  },
  responses: {
    method: "POST",
    path: "/v1/responses",
    door: "account",
    operation: "responses",
    streams: true,
    schema: "responses",
  },
  // Anthropic's Messages API: a chat completion in another wire format, so it runs the chat
  // operation (a connection allowed chat may call it, under chat's limits).
  messages: {
    method: "POST",
    path: "/v1/messages",
    door: "account",
    operation: "chat",
    streams: true,
    schema: "messages",
  },
  think: {
    method: "POST",
    path: "/v1/think",
    door: "account",
    operation: "think",
    streams: false,
    schema: "think",
  },
  embeddings: {
    method: "POST",
    path: "/v1/embeddings",
    door: "account",
    operation: "embeddings",
    streams: false,
    schema: "embeddings",
  },
  mppChat: {
    method: "POST",
    path: "/v1/mpp/chat/completions",
    door: "paid",
    operation: "chat",
    streams: false,
    schema: "paidChat",
  },
  livez: { method: "GET", path: "/livez", door: "public", operation: null, streams: false, schema: null },
  readyz: { method: "GET", path: "/readyz", door: "public", operation: null, streams: false, schema: null },
  // The public OpenAPI document (services/api-edge/src/openapi/), with the paid door's prices.
  openapi: {
    method: "GET",
    path: "/openapi.json",
    door: "public",
    operation: null,
    streams: false,
    schema: null,
  },
} as const satisfies Record<string, RouteSpec>;

export type RouteId = keyof typeof ROUTES;

/** The routes of one door. */
export type RouteIdOn<D extends RouteDoor> = {
  [K in RouteId]: (typeof ROUTES)[K]["door"] extends D ? K : never;
}[RouteId];

export const ROUTE_IDS = Object.keys(ROUTES) as [RouteId, ...RouteId[]];

/** A route as the docs write it: `POST /v1/think`, `GET /v1/models/{model}`. */
export function routeLabel(spec: RouteSpec): string {
  return `${spec.method} ${spec.path.replace(/:([A-Za-z]+)/g, "{$1}")}`;
}

/**
 * The methods a path answers (the `Allow` header of its 405), given the routes registered: a
 * GET also answers HEAD.
 */
export function allowedMethods(path: string, ids: readonly RouteId[] = ROUTE_IDS): string[] {
  const methods = new Set<string>();
  for (const id of ids) {
    const spec: RouteSpec = ROUTES[id];
    if (spec.path !== path) continue;
    methods.add(spec.method);
    if (spec.method === "GET") methods.add("HEAD");
  }
  return [...methods];
}

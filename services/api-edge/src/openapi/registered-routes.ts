import type { FastifyInstance } from "fastify";

/** A route a fastify app answers, its path as OpenAPI spells it (`{name}`). */
export interface RegisteredRoute {
  method: string;
  path: string;
}

/**
 * Every method and path a ready fastify app routes, read from its route tree
 * (`printRoutes({ commonPrefix: false })`: one line per path segment, indented four characters
 * a level, the methods in parentheses). HEAD, which fastify adds to every GET, is left out.
 * The documents' tests compare this with their operations.
 */
export function registeredRoutes(app: FastifyInstance): RegisteredRoute[] {
  const stack: string[] = [];
  const routes: RegisteredRoute[] = [];
  for (const line of app.printRoutes({ commonPrefix: false }).split("\n")) {
    const match = /^((?:[│ ] {3})*)[├└]── (\S+)(?: \(([^)]*)\))?$/.exec(line.trimEnd());
    if (!match) continue;
    const depth = match[1]!.length / 4;
    stack.length = depth;
    stack.push(match[2]!);
    const path = stack.join("").replace(/:([A-Za-z]+)/g, "{$1}");
    for (const method of (match[3] ?? "").split(",").map((m) => m.trim())) {
      if (method && method !== "HEAD" && method !== "-") routes.push({ method, path });
    }
  }
  return routes;
}

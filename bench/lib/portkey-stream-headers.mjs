// Preload for the Portkey peer (`node --import ./bench/lib/portkey-stream-headers.mjs …`).
// Portkey appends its x-portkey-* headers to the upstream's streamed response, whose headers
// fetch made immutable; under the @hono/node-server it installs, every streamed chat then fails
// with `TypeError: immutable`. This hands Portkey a copy of a streamed upstream response with
// mutable headers (same status, body and headers); buffered responses pass through untouched.
const upstreamFetch = globalThis.fetch;
const FetchResponse = globalThis.Response;

globalThis.fetch = async function fetch(...args) {
  const res = await upstreamFetch.apply(this, args);
  if (!res.headers.get("content-type")?.startsWith("text/event-stream")) return res;
  return new FetchResponse(res.body, {
    status: res.status,
    statusText: res.statusText,
    headers: new Headers(res.headers),
  });
};

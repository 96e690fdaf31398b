import type { AuthorizeResponse } from "@tollgate/proto/auth";
import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import type { FastifyReply, FastifyRequest } from "fastify";
import { EdgeError } from "../domain/errors.js";
import type { StoredResponseItem } from "../domain/response-items.js";
import {
  chatBodyFromResponses,
  itemReferencesOf,
  type ResponseLabels,
  type ResponsesInputItem,
  responseFromChat,
} from "../domain/responses.js";
import { ResponsesStream } from "../domain/responses-stream.js";
import { translatedFormat } from "../http/sse.js";
import {
  completeChat,
  completionInput,
  guardIdempotency,
  objectId,
  parseAccountBody,
  streamCompletion,
  unixNow,
} from "./account-inference.js";
import { authorizeRequest, checkKeyAndRoute, releaseHold } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.responses;

/** The refusal of an item reference that names nothing this account may read. */
function unknownItem(index: number, id: string): EdgeError {
  return new EdgeError(
    "invalid_request",
    `input: ${index}: item_reference ${JSON.stringify(id)} is unknown or expired (output items are kept for a limited time; with store: false the earlier answer goes back as a message instead)`,
  );
}

/**
 * The stored items an input refers to, before anything is held: a reference to nothing (never
 * stored, or expired) is refused once the key is checked.
 */
async function storedItemsOf(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  input: string | readonly ResponsesInputItem[],
): Promise<{ refs: { index: number; id: string }[]; items: StoredResponseItem[] }> {
  const refs = itemReferencesOf(input);
  if (refs.length === 0) return { refs, items: [] };
  const found = await ctx.responseItems.getMany(refs.map((r) => r.id));
  const missing = found.indexOf(undefined);
  if (missing >= 0) {
    await checkKeyAndRoute(ctx, req, reply, OPERATIONS[operation]);
    const ref = refs[missing]!;
    throw unknownItem(ref.index, ref.id);
  }
  return { refs, items: found as StoredResponseItem[] };
}

/**
 * POST /v1/responses: the text subset of the Responses API. The request is translated to a chat
 * request (these bytes are what the router forwards and counts), the chat answer back to a
 * `response` object, or with `stream: true` the chat chunks to the Responses event sequence,
 * billed like a chat stream. An answer's output message is kept (unless `store: false`) for the
 * account's later `item_reference` inputs, whose text counts in the quote like the body's.
 */
export function responsesRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const route = OPERATIONS[operation];
      const body = await parseAccountBody(ctx, req, reply, route, ctx.schemas[schema]);
      const streaming = body.stream === true;
      if (await guardIdempotency(ctx, req, reply, { route, scope: operation, streaming })) return reply;
      const { refs, items } = await storedItemsOf(ctx, req, reply, body.input);
      const grant = await authorizeRequest(ctx, req, reply, {
        route,
        model: body.model ?? "",
        maxOutputTokens: body.max_output_tokens ?? undefined,
        messageCount: (typeof body.input === "string" ? 1 : body.input.length) + (body.instructions ? 1 : 0),
        extraInputBytes: items.reduce((sum, item) => sum + Buffer.byteLength(item.text), 0),
      });
      const account = grant.principal?.accountId ?? "";
      const foreign = items.findIndex((item) => item.account !== account);
      if (foreign >= 0) {
        await releaseHold(ctx, req, grant);
        throw unknownItem(refs[foreign]!.index, refs[foreign]!.id);
      }
      const referenced = items.map((item) => item.text);
      const chat = chatBodyFromResponses(body, grant.model, grant.maxOutputTokens, referenced);
      const input = completionInput(req, grant, Operation.CHAT, Buffer.from(JSON.stringify(chat)));
      const labels: ResponseLabels = {
        id: objectId("resp"),
        messageId: objectId("msg"),
        model: grant.model,
        maxOutputTokens: grant.maxOutputTokens,
        now: unixNow(),
      };
      const keep = keeper(ctx, req, grant, body.store !== false, labels.messageId);
      if (streaming) {
        const format = translatedFormat(new ResponsesStream(body, labels, keep));
        return streamCompletion(ctx, req, reply, grant, input, { includeUsage: false, format });
      }
      const { answer, usage } = await completeChat(ctx, req, reply, grant, input);
      // Kept off the answer's path (no store round trip before it): the write goes out on the
      // store's connection before any later request of the caller can ask for it.
      void keep(answer.text);
      return responseFromChat(body, answer, usage, labels);
    },
  };
}

/**
 * What keeps a finished answer's output message for the account's later references: nothing
 * when the request said `store: false`. A store that fails costs the caller only a later
 * reference (refused as unknown), never this answer; the text is never logged.
 */
function keeper(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  grant: AuthorizeResponse,
  store: boolean,
  messageId: string,
): (text: string) => Promise<void> {
  if (!store) return async () => {};
  const account = grant.principal?.accountId ?? "";
  return (text) =>
    ctx.responseItems
      .put(messageId, { account, role: "assistant", text })
      .catch((err: unknown) => req.log.warn({ err }, "response output item not stored"));
}

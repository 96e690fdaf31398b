import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import type { FastifyReply, FastifyRequest } from "fastify";
import {
  chatBodyFromMessages,
  type MessageLabels,
  MessagesStream,
  messageFromChat,
} from "../domain/messages.js";
import { anthropicKey } from "../http/credentials.js";
import { anthropicErrorBody, toHttpError } from "../http/errors.js";
import { translatedFormat } from "../http/sse.js";
import {
  completeChat,
  completionInput,
  guardIdempotency,
  objectId,
  parseAccountBody,
  streamCompletion,
} from "./account-inference.js";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.messages;

/**
 * Anthropic's name for the request id: its SDKs read this header (`message._request_id`,
 * `error.requestID`), not `x-request-id`, which every answer carries too.
 */
const ANTHROPIC_REQUEST_ID = "request-id";

/**
 * POST /v1/messages: the text subset of Anthropic's Messages API (docs/account-door.md,
 * "Routes"), for Anthropic's SDKs: the key comes as `x-api-key` (or `Authorization: Bearer`),
 * the request is translated to a chat request through the same quote, hold and output cap
 * (`max_tokens`), and the answer back to a `message`, or with `stream: true` the chat chunks to
 * Anthropic's event sequence, billed like a chat stream. Errors take Anthropic's shape, with the
 * status of the gateway's error table. Every answer names its request id as Anthropic does too.
 */
export function messagesRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    // Before anything can fail: a refusal (a 405 too) and a stream's headers keep it.
    onRequest: async (req, reply) => {
      reply.header(ANTHROPIC_REQUEST_ID, req.id);
    },
    handler: async (req, reply) => {
      const route = OPERATIONS[operation];
      const body = await parseAccountBody(ctx, req, reply, route, ctx.schemas[schema], anthropicKey);
      const streaming = body.stream === true;
      // Idempotency records are scoped by route id: a Messages key never meets a chat one.
      const scope = "messages";
      if (await guardIdempotency(ctx, req, reply, { route, scope, streaming, readKey: anthropicKey })) {
        return reply;
      }
      const grant = await authorizeRequest(ctx, req, reply, {
        route,
        model: body.model ?? "",
        maxOutputTokens: body.max_tokens,
        messageCount: body.messages.length + (body.system != null ? 1 : 0),
        readKey: anthropicKey,
      });
      const chat = chatBodyFromMessages(body, grant.model, grant.maxOutputTokens);
      const input = completionInput(req, grant, Operation.CHAT, Buffer.from(JSON.stringify(chat)));
      const labels: MessageLabels = { id: objectId("msg"), model: grant.model };
      if (streaming) {
        const format = translatedFormat(new MessagesStream(labels));
        return streamCompletion(ctx, req, reply, grant, input, { includeUsage: false, format });
      }
      const { answer, usage } = await completeChat(ctx, req, reply, grant, input);
      return messageFromChat(answer, usage, labels);
    },
    errorHandler: sendAnthropicError,
  };
}

/**
 * An error in Anthropic's shape, with its `request-id` header: the Messages route's answers, and
 * a path below it that the gateway does not serve (`/v1/messages/count_tokens`, say), so an
 * Anthropic client reads its own error there too.
 */
export function sendAnthropicError(err: unknown, req: FastifyRequest, reply: FastifyReply) {
  const e = toHttpError(err, req.log);
  reply.header(ANTHROPIC_REQUEST_ID, req.id);
  if (e.headers) reply.headers(e.headers);
  return reply.code(e.status).send(anthropicErrorBody(e, req.id));
}

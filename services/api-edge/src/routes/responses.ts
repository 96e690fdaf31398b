import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import { chatBodyFromResponses, type ResponseLabels, responseFromChat } from "../domain/responses.js";
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
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.responses;

/**
 * POST /v1/responses: the text subset of the Responses API. The request is translated to a chat
 * request (these bytes are what the router forwards and counts), the chat answer back to a
 * `response` object, or with `stream: true` the chat chunks to the Responses event sequence,
 * billed like a chat stream.
 */
export function responsesRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const body = await parseAccountBody(ctx, req, reply, OPERATIONS[operation], ctx.schemas[schema]);
      const streaming = body.stream === true;
      const grant = await authorizeRequest(ctx, req, reply, {
        route: OPERATIONS[operation],
        model: body.model ?? "",
        maxOutputTokens: body.max_output_tokens ?? undefined,
        messageCount: (typeof body.input === "string" ? 1 : body.input.length) + (body.instructions ? 1 : 0),
      });
      if (await guardIdempotency(ctx, req, reply, grant, operation, streaming)) return reply;
      const chat = chatBodyFromResponses(body, grant.model, grant.maxOutputTokens);
      const input = completionInput(req, grant, Operation.CHAT, Buffer.from(JSON.stringify(chat)));
      const labels: ResponseLabels = {
        id: objectId("resp"),
        messageId: objectId("msg"),
        model: grant.model,
        maxOutputTokens: grant.maxOutputTokens,
        now: unixNow(),
      };
      if (streaming) {
        const format = translatedFormat(new ResponsesStream(body, labels));
        return streamCompletion(ctx, req, reply, grant, input, { includeUsage: false, format });
      }
      const { answer, usage } = await completeChat(ctx, req, reply, grant, input);
      return responseFromChat(body, answer, usage, labels);
    },
  };
}

import type { RequestSchemaKey } from "@tollgate/proto/routes";
import type { z } from "zod";
import { chatSchema, paidChatSchema } from "./chat.js";
import { completionSchema } from "./completions.js";
import { embeddingsSchema } from "./embeddings.js";
import { messagesSchema } from "./messages.js";
import { responsesSchema } from "./responses.js";
import { thinkSchema } from "./think.js";

/**
 * Every public route's request schema, built once for the configured message limit
 * (MAX_MESSAGES), under the key the route table names (packages/proto/src/routes.ts).
 */
export function requestSchemas(maxMessages: number) {
  return {
    chat: chatSchema(maxMessages),
    paidChat: paidChatSchema(maxMessages),
    completion: completionSchema(maxMessages),
    responses: responsesSchema(maxMessages),
    messages: messagesSchema(maxMessages),
    think: thinkSchema(maxMessages),
    embeddings: embeddingsSchema(maxMessages),
  } satisfies Record<RequestSchemaKey, z.ZodType>;
}

export type RequestSchemas = ReturnType<typeof requestSchemas>;

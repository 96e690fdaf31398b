import { chatSchema, paidChatSchema } from "./chat.js";
import { completionSchema } from "./completions.js";
import { responsesSchema } from "./responses.js";
import { thinkSchema } from "./think.js";

/** Every public route's request schema, built once for the configured message limit (MAX_MESSAGES). */
export function requestSchemas(maxMessages: number) {
  return {
    chat: chatSchema(maxMessages),
    paidChat: paidChatSchema(maxMessages),
    completion: completionSchema(maxMessages),
    responses: responsesSchema(maxMessages),
    think: thinkSchema(maxMessages),
  };
}

export type RequestSchemas = ReturnType<typeof requestSchemas>;

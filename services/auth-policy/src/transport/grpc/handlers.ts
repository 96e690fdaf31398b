import type { Handlers } from "@tollgate/kit/grpc";
import { type AuthService, Route } from "@tollgate/proto/auth";
import { authorize } from "../../domain/authorize.js";
import type { KeyStore } from "../../domain/ports.js";
import { toStatusError } from "./errors.js";

/** Maps AuthService messages to the domain and back. */
export function authHandlers(store: KeyStore): Handlers<typeof AuthService> {
  return {
    async authorize(req) {
      try {
        const a = await authorize(store, {
          key: req.key,
          model: req.model,
          runsModel: req.route !== Route.MODELS,
          ...(req.maxOutputTokens !== undefined ? { maxOutputTokens: req.maxOutputTokens } : {}),
        });
        return {
          principal: { accountId: a.accountId, connectionId: a.connectionId, keyId: a.keyId },
          model: a.model,
          ...(a.maxOutputTokens !== undefined ? { maxOutputTokens: a.maxOutputTokens } : {}),
          allowedModels: [...a.allowedModels],
          defaultModel: a.defaultModel,
        };
      } catch (err) {
        throw toStatusError(err);
      }
    },
  };
}

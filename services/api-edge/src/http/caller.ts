import type { FastifyReply } from "fastify";
import { EdgeError } from "../domain/errors.js";

/**
 * An AbortSignal that fires when the caller goes away before the response is finished; already
 * aborted when it went away before this is called (while its key was checked or its payment
 * verified, say: the response's `close` came before anyone listened for it), so that a model is
 * never run, and charged, for a caller that is no longer there (docs/money.md, "Holds").
 */
export function callerGone(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  const res = reply.raw;
  const gone = () => {
    if (!res.writableFinished) controller.abort();
  };
  if (res.closed) gone();
  else res.on("close", gone);
  return controller.signal;
}

/** The refusal of a request whose caller left before its model ran (a 499 nobody reads). */
export const callerLeft = () =>
  new EdgeError("client_closed_request", "the caller closed the request before the model ran");

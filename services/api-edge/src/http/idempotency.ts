import { createHash, randomUUID } from "node:crypto";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { EdgeError } from "../domain/errors.js";
import {
  IDEMPOTENCY_CLAIM_MS,
  IDEMPOTENCY_KEY,
  IDEMPOTENCY_RENEW_MS,
  IDEMPOTENCY_TTL_MS,
  IDEMPOTENCY_WAIT_MS,
  type IdempotencyStore,
} from "../domain/idempotency.js";
import { callerGone, callerLeft } from "./caller.js";

declare module "fastify" {
  interface FastifyRequest {
    /**
     * Set when this request holds an idempotency claim that its response settles; `renewal`
     * keeps the claim alive while the request runs.
     */
    idempotency?: { id: string; fingerprint: string; owner: string; renewal: NodeJS.Timeout };
  }
}

/** Response headers worth replaying (the request id is the new request's own). */
const REPLAYED_HEADERS = ["content-type", "x-tollgate-cost", "x-tollgate-budget-remaining"];
const POLL_MS = 50;
/**
 * Duplicates of one key that may wait at once on this replica; another is 409
 * `idempotency_in_progress` at once. Waiting counts no rate-limit unit, so without a bound one
 * key could keep any number of requests open and polling (docs/account-door.md).
 */
export const MAX_WAITING_DUPLICATES = 8;

const sha256 = (data: string | Buffer) => createHash("sha256").update(data).digest("hex");

/**
 * Idempotency-Key on account-door POSTs (docs/contract.md, "Idempotency"): the same key and body
 * within 24 h replays the stored response without running the model again; the same key with
 * another body is a 422; a duplicate arriving while the first runs waits for it. Scoped per Virtual
 * Key and route, so keys never meet across callers. Streams cannot be replayed and are refused.
 */
export class Idempotency {
  constructor(
    private readonly store: IdempotencyStore,
    private readonly maxWaitMs = IDEMPOTENCY_WAIT_MS,
    private readonly claim = { claimMs: IDEMPOTENCY_CLAIM_MS, renewMs: IDEMPOTENCY_RENEW_MS },
  ) {}

  /** Settles claims from the response about to be sent: stored when 2xx, dropped otherwise. */
  register(app: FastifyInstance): void {
    app.addHook("onSend", async (req, reply, payload) => {
      const claim = req.idempotency;
      if (!claim) return payload;
      req.idempotency = undefined;
      clearInterval(claim.renewal);
      try {
        if (reply.statusCode >= 200 && reply.statusCode < 300) {
          const headers: Record<string, string> = {};
          for (const name of REPLAYED_HEADERS) {
            const value = reply.getHeader(name);
            if (value !== undefined) headers[name] = String(value);
          }
          const body = Buffer.isBuffer(payload)
            ? payload
            : Buffer.from(typeof payload === "string" ? payload : "");
          await this.store.complete(
            claim.id,
            claim.fingerprint,
            claim.owner,
            { status: reply.statusCode, headers, body },
            IDEMPOTENCY_TTL_MS,
          );
        } else {
          await this.store.abandon(claim.id, claim.fingerprint, claim.owner);
        }
      } catch (err) {
        req.log.error({ err }, "idempotency record not saved");
      }
      return payload;
    });
  }

  /**
   * Why the request's Idempotency-Key header cannot be used at all, judged from the request
   * alone (no store): the routes ask before authorization, so such a refusal takes nothing.
   */
  refusal(req: FastifyRequest, streaming: boolean): EdgeError | undefined {
    const key = req.headers["idempotency-key"];
    if (key === undefined) return undefined;
    if (typeof key !== "string" || !IDEMPOTENCY_KEY.test(key)) {
      return new EdgeError(
        "idempotency_key_invalid",
        "Idempotency-Key must be 1 to 255 visible ASCII characters (no spaces)",
      );
    }
    if (streaming) {
      return new EdgeError(
        "idempotency_unsupported_for_streams",
        "Idempotency-Key cannot be used with stream: true",
      );
    }
    return undefined;
  }

  /**
   * Call once the key and route are checked, before anything is held (routes/account-inference.ts,
   * guardIdempotency). Resolves true when a stored response was sent (the route must return the
   * reply), false when the route should run.
   */
  async guard(req: FastifyRequest, reply: FastifyReply, scope: string, streaming: boolean): Promise<boolean> {
    const key = req.headers["idempotency-key"];
    if (key === undefined) return false;
    const refused = this.refusal(req, streaming);
    if (refused) throw refused;
    const id = sha256(`${scope}\n${key}`);
    const fingerprint = sha256(req.rawBody ?? Buffer.alloc(0));
    const deadline = Date.now() + this.maxWaitMs;
    const gone = callerGone(reply);
    // Each claim is its request's own: a claim that lapsed and was taken over by a retry is
    // never renewed, completed over or dropped by the request that first held it.
    const owner = randomUUID();
    let waits = false;
    try {
      for (;;) {
        // A caller gone (while its key was checked, or while it waited for a duplicate) claims
        // nothing and runs nothing: its claim would only be held, renewed and abandoned, and the
        // request authorized with a hold (and a rate-limit unit) for nobody (docs/money.md).
        if (gone.aborted) throw callerLeft();
        const decision = await this.store.begin(id, fingerprint, owner, this.claim.claimMs);
        switch (decision.kind) {
          case "run": {
            // The claim lasts while this process runs the request: renewed until the response
            // settles it or the connection closes without one, it lapses soon after this process
            // dies, so a retry is not held up by a request nobody runs any more.
            const renewal = setInterval(() => {
              this.store.renew(id, fingerprint, owner, this.claim.claimMs).catch((err: unknown) => {
                req.log.warn({ err }, "idempotency claim not renewed");
              });
            }, this.claim.renewMs);
            renewal.unref();
            reply.raw.once("close", () => clearInterval(renewal));
            req.idempotency = { id, fingerprint, owner, renewal };
            return false;
          }
          case "replay":
            reply
              .code(decision.response.status)
              .headers({ ...decision.response.headers, "idempotent-replayed": "true" })
              .send(decision.response.body);
            return true;
          case "conflict":
            throw new EdgeError(
              "idempotency_key_reused",
              "this Idempotency-Key was used with a different request body; use a new key",
            );
          case "in_progress": {
            // A duplicate whose caller left while it waited never runs (checked at the loop's
            // top): it would run the model, and charge for it, for nobody.
            const others = this.waiting.get(id) ?? 0;
            if (!waits && others >= MAX_WAITING_DUPLICATES) throw stillRunning();
            if (!waits) this.waiting.set(id, others + 1);
            waits = true;
            if (Date.now() > deadline) throw stillRunning();
            await new Promise((r) => setTimeout(r, POLL_MS));
          }
        }
      }
    } finally {
      if (waits) {
        const left = (this.waiting.get(id) ?? 1) - 1;
        if (left > 0) this.waiting.set(id, left);
        else this.waiting.delete(id);
      }
    }
  }

  /** Duplicates waiting on this replica, by record id. */
  private readonly waiting = new Map<string, number>();
}

const stillRunning = () =>
  new EdgeError("idempotency_in_progress", "the request with this Idempotency-Key is still running");

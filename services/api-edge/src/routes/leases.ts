import { createHash } from "node:crypto";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { quoteOf } from "@tollgate/config";
import { type Client, GrpcStatus, type MethodsOf, RemoteError } from "@tollgate/kit/grpc";
import type { Logger } from "@tollgate/kit/log";
import { retrying } from "@tollgate/kit/retry";
import {
  type AcquireLeaseResponse,
  type AuthorizeRequestSchema,
  type AuthorizeResponse,
  AuthorizeResponseSchema,
  type AuthService,
} from "@tollgate/proto/auth";
import { EdgeLease, nextLeaseSize, type Ticket } from "../domain/lease.js";

/** The lease calls of AuthService. */
export type LeaseClient = Pick<Client<MethodsOf<typeof AuthService>>, "acquireLease" | "returnLease">;

type AskInit = MessageInitShape<typeof AuthorizeRequestSchema>;

/** One lease held for one shape of request. */
interface Held {
  lease: EdgeLease;
  leaseId: string;
  /** auth-policy's verdict for the shape, with the budgets left and the window after the lease. */
  verdict: AcquireLeaseResponse;
  retired: boolean;
  /** When a request was last admitted on it. */
  usedAtMs: number;
  /** Its shape's key hash. */
  keyHash: string;
  /** Its return's first attempt, settled (a return auth-policy could not take is retried behind). */
  firstTry?: Promise<void>;
}

/** What the edge knows of one shape (key, route, model, cap, reasoning). */
interface Shape {
  /** The hash of its key (the key itself is never kept). */
  keyHash: string;
  current?: Held;
  acquiring?: Promise<void>;
  /** Until then each request is authorized on its own (no lease could be granted). */
  exactUntilMs: number;
  /** Requests the last lease admitted: the next one is sized from it. */
  lastAdmitted?: number;
}

/** Deadline of a lease call. */
const LEASE_TIMEOUT_MS = 5_000;
/** Least time left of a request's authorization deadline for an AcquireLease to be worth sending. */
const MIN_ACQUIRE_MS = 250;
/** How a return that met auth-policy away is tried again. */
const RETURN_RETRY = { delayMs: 500, forMs: 30_000 };
/**
 * A lease no request used for this long goes back before its 1 s of use is up, so what it
 * holds is soon free for other replicas again. Long enough that a caller pausing between
 * requests (an agent between tool calls) keeps its lease instead of paying an AcquireLease on
 * the next one (docs/money.md, "Leases"). What this replica reports of a budget never counts
 * its idle leases: they go back first (returnIdle, returnIdleOf, and each acquisition).
 */
const IDLE_MS = 500;
/** Shapes remembered at most; past that, those without a lease are forgotten. */
const MAX_SHAPES = 10_000;

/** The errors of AuthService that mean "no answer", not a refusal: the request is asked on its own. */
const NO_ANSWER = new Set<number>([
  GrpcStatus.UNAVAILABLE,
  GrpcStatus.DEADLINE_EXCEEDED,
  GrpcStatus.INTERNAL,
  GrpcStatus.UNIMPLEMENTED,
  GrpcStatus.CANCELLED,
  GrpcStatus.UNKNOWN,
]);

/** What is left until `deadlineMs`, at least 1 ms (a call given 0 would wait without a deadline). */
export function msLeft(deadlineMs: number): number {
  return Math.max(1, deadlineMs - Date.now());
}

/** Waits for `work` until `deadlineMs` at most; the work goes on after that, unwaited. */
async function untilDeadline(work: Promise<void>, deadlineMs: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, msLeft(deadlineMs));
  });
  try {
    await Promise.race([work, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** Whether a failed AcquireLease is auth-policy's refusal of the request (the same Authorize gives). */
function isRefusal(err: unknown): boolean {
  return err instanceof RemoteError && !!err.code && !NO_ANSWER.has(err.status);
}

const tickets = new WeakMap<AuthorizeResponse, Ticket>();

/** The lease ticket of a grant admitted on a lease; undefined for a grant auth-policy gave alone. */
export function ticketOf(grant: AuthorizeResponse): Ticket | undefined {
  return tickets.get(grant);
}

/**
 * The leases of one api-edge replica (docs/money.md, "Leases"), one per shape of request: a
 * request whose shape holds a usable lease that covers it is admitted here, with no call to
 * auth-policy; otherwise a lease is acquired (one call, single-flight per shape), and when
 * none can be granted the request is left to Authorize. A lease is used for its `use_ms` (1 s,
 * the revocation bound: a revoked key or changed policy is seen at the next acquisition), or
 * until no request used it for IDLE_MS, then returned once its last request ended. Before a
 * lease is acquired for a key, or a budget of it is reported, the key's idle leases go back.
 */
export class LeaseBook {
  private readonly shapes = new Map<string, Shape>();
  /** The shapes of each key, by key hash. */
  private readonly byKey = new Map<string, Set<Shape>>();
  /** The returns under way, and the lease each returns. */
  private readonly returning = new Map<Promise<void>, Held>();
  /** Recent stopLeasing calls, for leases whose acquisition was under way. */
  private stopped: Array<{ of: PrincipalIds; atMs: number; seq: number }> = [];
  /** stopLeasing calls so far. */
  private stops = 0;
  private closed = false;

  constructor(
    private readonly auth: LeaseClient,
    private readonly log: Logger,
  ) {}

  /**
   * A grant for this request admitted on a lease, or undefined: authorize it on its own. Throws
   * auth-policy's refusal (the same status, code and message as Authorize's). `deadlineMs` is when
   * the request's authorization as a whole must be done: the calls made here for it (a return
   * waited for, an acquisition) stop there, so what is left of it is its own Authorize's.
   */
  async admit(
    ask: AskInit,
    deadlineMs = Date.now() + LEASE_TIMEOUT_MS,
  ): Promise<AuthorizeResponse | undefined> {
    if (this.closed) return undefined;
    const keyHash = keyHashOf(ask.key ?? "");
    const id = shapeOf(keyHash, ask);
    for (let attempt = 0; ; attempt++) {
      const shape = this.shapes.get(id) ?? this.remember(id, keyHash);
      const now = Date.now();
      const held = shape.current;
      if (held?.lease.usable(now)) {
        const grant = this.admitOn(held, ask, now);
        if (grant) return grant;
      }
      if (shape.exactUntilMs > now || attempt > 0 || this.closed) return undefined;
      shape.acquiring ??= this.acquire(shape, ask, deadlineMs).finally(() => {
        shape.acquiring = undefined;
      });
      await shape.acquiring;
    }
  }

  /**
   * Returns every lease of this key that no request is running on, and resolves once auth-policy
   * answered their returns (and the key's returns already under way): what it then reports of
   * the key's budgets (GET /v1/models) holds nothing this replica does not need.
   */
  async returnIdle(key: string, deadlineMs = Date.now() + LEASE_TIMEOUT_MS): Promise<void> {
    await untilDeadline(this.returnKeyIdle(keyHashOf(key)), deadlineMs);
  }

  /**
   * The same for the leases of one account, or of one key named by its id (the admin API's
   * views of budgets, which never see a key in clear), or of every key when neither is given.
   */
  async returnIdleOf(of: PrincipalIds): Promise<void> {
    await this.returnIdleWhere(this.shapes.values(), (h) => names(of, h.verdict));
  }

  /**
   * Stops admitting on every lease of the keys `of` names (a key by its id, a connection's or an
   * account's keys), in use or not, and on any lease of theirs being acquired now: the admin API
   * calls it once it has revoked, rotated, changed or deleted them, so this replica asks
   * auth-policy at their next request instead of serving the rest of a lease's second on what
   * it knew before (docs/account-door.md, "Keys and the admin API"). Requests in flight end on
   * their lease, which then goes back.
   */
  stopLeasing(of: PrincipalIds): void {
    this.stopped.push({ of, atMs: Date.now(), seq: ++this.stops });
    for (const shape of this.shapes.values()) {
      if (shape.current && names(of, shape.current.verdict)) this.retire(shape, shape.current);
    }
  }

  /** Whether a lease asked for when `stops` stopLeasing calls had been made is for keys one named since. */
  private stoppedSince(verdict: AcquireLeaseResponse, stops: number): boolean {
    const now = Date.now();
    // A stop is kept as long as an acquisition started before it can take to answer.
    this.stopped = this.stopped.filter((s) => now - s.atMs <= LEASE_TIMEOUT_MS);
    return this.stopped.some((s) => s.seq > stops && names(s.of, verdict));
  }

  /** returnIdle by key hash. */
  private async returnKeyIdle(keyHash: string): Promise<void> {
    await this.returnIdleWhere(this.byKey.get(keyHash) ?? [], (h) => h.keyHash === keyHash);
  }

  /**
   * Retires the idle leases of `shapes` that `whose` selects, and waits for the first attempt of
   * their returns and of every other return of theirs under way: a return auth-policy could not
   * take is retried behind, never waited for.
   */
  private async returnIdleWhere(shapes: Iterable<Shape>, whose: (h: Held) => boolean): Promise<void> {
    for (const shape of shapes) {
      const held = shape.current;
      if (held && held.lease.inFlight === 0 && whose(held)) this.retire(shape, held);
    }
    const back = [...this.returning.values()].flatMap((h) => (h.firstTry && whose(h) ? [h.firstTry] : []));
    if (back.length > 0) await Promise.all(back);
  }

  /** Stops leasing and returns every lease (after the requests in flight ended). */
  async close(): Promise<void> {
    this.closed = true;
    for (const shape of this.shapes.values()) if (shape.current) this.retire(shape, shape.current);
    await Promise.allSettled([...this.returning.keys()]);
  }

  private remember(id: string, keyHash: string): Shape {
    if (this.shapes.size >= MAX_SHAPES) {
      for (const [k, s] of this.shapes) {
        if (s.current || s.acquiring) continue;
        this.shapes.delete(k);
        const ofKey = this.byKey.get(s.keyHash);
        ofKey?.delete(s);
        if (ofKey?.size === 0) this.byKey.delete(s.keyHash);
      }
    }
    const shape: Shape = { keyHash, exactUntilMs: 0 };
    this.shapes.set(id, shape);
    const ofKey = this.byKey.get(keyHash);
    if (ofKey) ofKey.add(shape);
    else this.byKey.set(keyHash, new Set([shape]));
    return shape;
  }

  private admitOn(held: Held, ask: AskInit, now: number): AuthorizeResponse | undefined {
    const v = held.verdict;
    const g = v.grant!;
    const cap = g.maxOutputTokens ?? 0;
    const sequences = Math.max(1, ask.outputSequences ?? 1);
    const bodyBytes = ask.bodyBytes ?? 0;
    const quote = v.prices
      ? quoteOf(
          bodyBytes,
          ask.messageCount ?? bodyBytes,
          cap,
          {
            inputPerMillion: BigInt(v.prices.inputPerMillion),
            outputPerMillion: BigInt(v.prices.outputPerMillion),
          },
          sequences,
        )
      : undefined;
    if (quote === undefined && held.lease.terms.budget !== undefined) return undefined;
    const tokens = cap * sequences + (ask.estimatedInputTokens ?? 0);
    const ticket = held.lease.admit({ ...(quote !== undefined ? { quote } : {}), tokens }, now);
    if (!ticket) return undefined;
    held.usedAtMs = now;
    const left = held.lease.budgetLeftNow ?? 0n;
    const plus = (after: string) => (after === "" ? "" : (BigInt(after) + left).toString());
    const rl = g.rateLimit;
    const grant = create(AuthorizeResponseSchema, {
      ...(g.principal ? { principal: g.principal } : {}),
      model: g.model,
      ...(g.maxOutputTokens !== undefined ? { maxOutputTokens: g.maxOutputTokens } : {}),
      allowedModels: g.allowedModels,
      defaultModel: g.defaultModel,
      reservationId: held.leaseId === "" ? "" : `${held.leaseId}~${ticket.ticket}`,
      ...(rl
        ? {
            rateLimit: {
              ...rl,
              // The window's units after the lease took its own, plus those it has not used yet.
              remaining:
                rl.remaining + (held.lease.unitsLeft(rl.unit === "tokens" ? "tokens" : "requests") ?? 0),
            },
          }
        : {}),
      ...(g.keyValidUntil ? { keyValidUntil: g.keyValidUntil } : {}),
      quote: quote?.toString() ?? "",
      budgetRemaining: plus(g.budgetRemaining),
      keyBudgetRemaining: plus(g.keyBudgetRemaining),
    });
    tickets.set(grant, ticket);
    return grant;
  }

  private async acquire(shape: Shape, ask: AskInit, deadlineMs: number): Promise<void> {
    // What auth-policy reports with the lease (the budgets left, which every request admitted on
    // it reports on) holds none of this replica's idle leases of the key: they go back first,
    // this shape's own lease too when no request runs on it (it could not admit this request:
    // its allowance, units or time ran out), so the unused part of its allowance is not counted.
    // A return that has no answer by the deadline goes on behind (returns are retried anyway).
    await untilDeadline(this.returnKeyIdle(shape.keyHash), deadlineMs);
    if (deadlineMs - Date.now() < MIN_ACQUIRE_MS) {
      // Too little time left for an answer: a lease granted after this replica stopped waiting
      // would hold its budget, unused, until its TTL. The request is authorized on its own.
      shape.exactUntilMs = Date.now() + 1_000;
      return;
    }
    const sentAt = Date.now();
    const stopsAtSend = this.stops;
    let res: AcquireLeaseResponse;
    try {
      res = await this.auth.acquireLease(
        { request: ask, requests: nextLeaseSize(shape.current?.lease.admitted ?? shape.lastAdmitted) },
        { timeoutMs: Math.min(LEASE_TIMEOUT_MS, msLeft(deadlineMs)) },
      );
    } catch (err) {
      if (isRefusal(err)) throw err;
      this.log.warn({ err }, "no lease acquired; requests are authorized one at a time");
      shape.exactUntilMs = Date.now() + 1_000;
      return;
    }
    if (shape.current) this.retire(shape, shape.current);
    if (res.granted && this.stoppedSince(res, stopsAtSend)) {
      // Granted on what auth-policy knew before the change: given back unused, and the request
      // is authorized on its own, which sees the change.
      this.giveBack(this.held(shape, res, sentAt));
      return;
    }
    if (!res.granted) {
      shape.exactUntilMs = sentAt + res.useMs;
      return;
    }
    const held = this.held(shape, res, sentAt);
    const usableUntilMs = held.lease.terms.usableUntilMs;
    // Idle: once no request ran on it for IDLE_MS, it goes back early.
    held.lease.onIdle = () => {
      setTimeout(() => {
        if (held.lease.inFlight === 0 && Date.now() - held.usedAtMs >= IDLE_MS) this.retire(shape, held);
      }, IDLE_MS).unref();
    };
    shape.current = held;
    setTimeout(() => this.retire(shape, held), Math.max(0, usableUntilMs - Date.now()) + 5).unref();
  }

  /** A granted lease as this replica holds it. */
  private held(shape: Shape, res: AcquireLeaseResponse, sentAt: number): Held {
    const until = res.grant?.keyValidUntil ? timestampDate(res.grant.keyValidUntil).getTime() : Infinity;
    return {
      lease: new EdgeLease({
        ...(res.budget !== "" ? { budget: BigInt(res.budget) } : {}),
        ...(res.requests !== undefined ? { requests: res.requests } : {}),
        ...(res.tokens !== undefined ? { tokens: res.tokens } : {}),
        usableUntilMs: Math.min(sentAt + res.useMs, until),
      }),
      leaseId: res.leaseId,
      keyHash: shape.keyHash,
      verdict: res,
      retired: false,
      usedAtMs: sentAt,
    };
  }

  /** No more requests on this lease: returned once its last request ended. */
  private retire(shape: Shape, held: Held): void {
    if (held.retired) return;
    held.retired = true;
    if (shape.current === held) {
      shape.current = undefined;
      shape.lastAdmitted = held.lease.admitted;
    }
    if (held.lease.inFlight === 0) this.giveBack(held);
    else held.lease.onIdle = () => this.giveBack(held);
  }

  private giveBack(held: Held): void {
    if (held.leaseId === "") return;
    const back = held.lease.returned();
    const call = () => {
      const attempt = this.auth
        .returnLease(
          {
            leaseId: held.leaseId,
            committed: back.committed.toString(),
            unusedRequests: back.unusedRequests,
            unusedTokens: back.unusedTokens,
            unsure: back.unsure.map((u) => ({ ticket: u.ticket, quote: u.quote.toString() })),
          },
          { timeoutMs: LEASE_TIMEOUT_MS },
        )
        .then(() => undefined);
      held.firstTry ??= attempt.then(
        () => undefined,
        () => undefined,
      );
      return attempt;
    };
    const unavailable = (err: unknown) => err instanceof RemoteError && err.status === GrpcStatus.UNAVAILABLE;
    const done: Promise<void> = retrying(call, unavailable, RETURN_RETRY)
      .catch((err: unknown) => this.log.warn({ err }, "lease not returned; its hold lapses with its TTL"))
      .finally(() => this.returning.delete(done));
    this.returning.set(done, held);
  }
}

/** Keys named by id, or by their connection's or account's id (the admin API's names). */
export interface PrincipalIds {
  accountId?: string;
  connectionId?: string;
  keyId?: string;
}

/** Whether a lease's verdict is for keys `of` names (each id given must match). */
function names(of: PrincipalIds, verdict: AcquireLeaseResponse): boolean {
  const p = verdict.grant?.principal;
  if (!p) return false;
  return (
    (of.keyId === undefined || p.keyId === of.keyId) &&
    (of.connectionId === undefined || p.connectionId === of.connectionId) &&
    (of.accountId === undefined || p.accountId === of.accountId)
  );
}

const keyHashOf = (key: string) => createHash("sha256").update(key).digest("base64");

/** A request's shape: what auth-policy's verdict depends on. The key is hashed, never kept. */
function shapeOf(keyHash: string, ask: AskInit): string {
  return `${keyHash} ${ask.route ?? 0} ${ask.model ?? ""} ${ask.maxOutputTokens ?? "-"} ${ask.requireReasoning ? 1 : 0}`;
}

import { create, type DescMessage, type DescMethod, type MessageInitShape } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import * as grpc from "@grpc/grpc-js";
import type { Logger } from "pino";
import { type AccessTable, decide, type ServiceIdentity } from "./credentials.js";
import {
  type CallContext,
  type CallOptions,
  type Client,
  endRpcSpan,
  RemoteError,
  rpcSpec,
  type ServiceHandlers,
  toRemoteError,
  toServiceError,
} from "./grpc.js";
import { NOOP_SPAN, runInSpan, type Span, SpanKind, startSpan, tracingEnabled } from "./tracing.js";

/**
 * One service's handlers as its gRPC server registers them: the generated descriptor, the
 * handler implementation, who may call each method, and the logger its failures go to.
 */
export interface InProcessService<M extends GenServiceMethods> {
  service: GenService<M>;
  handlers: ServiceHandlers<M>;
  access: AccessTable<M>;
  log: Logger;
}

/**
 * A client of `target` that calls its handlers in this process, with the same messages, the same
 * access check and the same failures as a call over gRPC: a refused caller, a StatusError thrown
 * by a handler, an unknown failure (INTERNAL, logged) and a Redis outage (UNAVAILABLE) reach the
 * caller as the RemoteError a remote call would have rejected with. `caller` is the calling
 * service's identity, checked against the service's access table as a token or certificate is.
 */
export function inProcessClient<M extends GenServiceMethods>(
  target: InProcessService<M>,
  caller: ServiceIdentity,
): Client<M> {
  const { service, log } = target;
  const access = target.access as Readonly<Record<string, readonly ServiceIdentity[]>>;
  const client: Record<string, unknown> = {};
  for (const m of service.methods as DescMethod[]) {
    const handler = (target.handlers as Record<string, unknown>)[m.localName] as (
      req: unknown,
      ctx: CallContext,
    ) => unknown;
    const rpc = rpcSpec(service, m);
    const span = (): Span =>
      tracingEnabled() ? startSpan(rpc.name, SpanKind.CLIENT, rpc.attributes) : NOOP_SPAN;
    const fail = (s: Span, err: unknown): Error => {
      const remote = err instanceof RemoteError ? err : toRemoteError(toServiceError(err, log, m.name));
      const r = remote as RemoteError;
      endRpcSpan(s, SpanKind.CLIENT, r.status ?? grpc.status.UNKNOWN, r.code);
      return remote;
    };
    if (m.methodKind === "unary") {
      client[m.localName] = (req: MessageInitShape<DescMessage>, opts: CallOptions = {}) => {
        const s = span();
        const refused = refusal(access, m, caller, log);
        if (refused) return Promise.reject(fail(s, refused));
        const call = callOf(opts);
        let work: Promise<unknown>;
        try {
          work = runInSpan(s, () => handler(create(m.input, req), call.ctx) as Promise<unknown>);
        } catch (err) {
          work = Promise.reject(err);
        }
        return call.race(work).then(
          (res) => {
            call.done();
            endRpcSpan(s, SpanKind.CLIENT, grpc.status.OK);
            return create(m.output, res as MessageInitShape<DescMessage>);
          },
          (err: unknown) => {
            call.done();
            throw fail(s, err);
          },
        );
      };
    } else if (m.methodKind === "server_streaming") {
      client[m.localName] = (req: MessageInitShape<DescMessage>, opts: CallOptions = {}) =>
        (async function* () {
          const s = span();
          const refused = refusal(access, m, caller, log);
          if (refused) throw fail(s, refused);
          const call = callOf(opts);
          // Stays CANCELLED when the consumer stops iterating before the stream ends.
          let code: grpc.status | "failed" = grpc.status.CANCELLED;
          let iterator: AsyncIterator<unknown> | undefined;
          try {
            iterator = runInSpan(s, () =>
              (handler(create(m.input, req), call.ctx) as AsyncIterable<unknown>)[Symbol.asyncIterator](),
            );
            for (;;) {
              const next = await call.race(iterator.next());
              if (next.done) break;
              yield create(m.output, next.value as MessageInitShape<DescMessage>);
            }
            code = grpc.status.OK;
          } catch (err) {
            const remote = fail(s, err);
            code = "failed";
            throw remote;
          } finally {
            // The handler sees its caller go away, as on a cancelled gRPC stream, and its own
            // cleanup (e.g. billing the tokens produced) runs.
            call.done(code !== grpc.status.OK);
            void iterator?.return?.().catch(() => {});
            if (code !== "failed") endRpcSpan(s, SpanKind.CLIENT, code);
          }
        })();
    } else {
      throw new Error(`streaming kind ${m.methodKind} is not supported in process`);
    }
  }
  client.$close = () => {};
  client.$ready = async () => {};
  return client as Client<M>;
}

/** The refusal a gRPC server sends a caller its access table does not list, or undefined. */
function refusal(
  access: Readonly<Record<string, readonly ServiceIdentity[]>>,
  m: DescMethod,
  caller: ServiceIdentity,
  log: Logger,
): RemoteError | undefined {
  const decision = decide(access, m.localName, caller);
  if (decision === "allow") return undefined;
  log.warn({ method: m.name, caller, decision }, "internal call refused");
  return decision === "unauthenticated"
    ? new RemoteError(grpc.status.UNAUTHENTICATED, decision, "unauthenticated")
    : new RemoteError(grpc.status.PERMISSION_DENIED, decision, `${caller} may not call ${m.name}`);
}

/** One call's context, and its caller's cancel and deadline. */
interface InProcessCall {
  ctx: CallContext;
  /**
   * Settles as `work` does, or rejects when the caller cancels or the deadline passes first.
   * It holds nothing once settled: a stream races every message, and racing each against one
   * long-lived promise (Promise.race) would keep a reaction and the message per message, about
   * 400 bytes each, until the stream ends.
   */
  race<T>(work: Promise<T>): Promise<T>;
  /** Stops listening to the caller; with `cancel`, aborts the handler's signal too. */
  done(cancel?: boolean): void;
}

const EMPTY_METADATA = new grpc.Metadata();

function callOf(opts: CallOptions): InProcessCall {
  let controller: AbortController | undefined;
  let endedWith: RemoteError | undefined;
  // Rejects the race in progress, if any.
  let waiter: ((err: RemoteError) => void) | undefined;
  const stop = (err: RemoteError) => {
    if (endedWith) return;
    endedWith = err;
    controller?.abort();
    waiter?.(err);
  };
  const onAbort = () => stop(new RemoteError(grpc.status.CANCELLED, undefined, "Cancelled on client"));
  const timer = opts.timeoutMs
    ? setTimeout(
        () => stop(new RemoteError(grpc.status.DEADLINE_EXCEEDED, undefined, "Deadline exceeded")),
        opts.timeoutMs,
      )
    : undefined;
  if (opts.signal?.aborted) onAbort();
  else opts.signal?.addEventListener("abort", onAbort, { once: true });
  const ctx: CallContext = {
    // Made on first read, as a server call's: most handlers never read it.
    get signal() {
      if (!controller) {
        controller = new AbortController();
        if (endedWith) controller.abort();
      }
      return controller.signal;
    },
    metadata: EMPTY_METADATA,
  };
  return {
    ctx,
    race<T>(work: Promise<T>): Promise<T> {
      if (endedWith) {
        // Ended already: the work's own outcome no longer matters, nor is it unhandled.
        work.catch(() => {});
        return Promise.reject(endedWith);
      }
      return new Promise<T>((resolve, reject) => {
        waiter = reject;
        work.then(
          (v) => {
            if (waiter === reject) waiter = undefined;
            resolve(v);
          },
          (err: unknown) => {
            if (waiter === reject) waiter = undefined;
            reject(err);
          },
        );
      });
    },
    done(cancel = false) {
      if (timer) clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
      if (cancel && !endedWith) {
        endedWith = new RemoteError(grpc.status.CANCELLED, undefined, "Cancelled on client");
        controller?.abort();
      }
    },
  };
}

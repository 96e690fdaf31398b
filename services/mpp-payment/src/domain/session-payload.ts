import type { Address, Hex } from "viem";
import { z } from "zod";
import { MAX_AMOUNT } from "./amounts.js";
import { PaymentError } from "./errors.js";
import type { ChannelDescriptor } from "./ports.js";

const hex32 = z
  .string()
  .regex(/^0x[0-9a-fA-F]{64}$/)
  .transform((v) => v as Hex);
const address = z
  .string()
  .regex(/^0x[0-9a-fA-F]{40}$/)
  .transform((v) => v as Address);
const hexBytes = z
  .string()
  .regex(/^0x(?:[0-9a-fA-F]{2})+$/)
  .transform((v) => v as Hex);
/** Decimal base units within what the store can hold (amounts.ts). */
const amount = z
  .string()
  .regex(/^(0|[1-9][0-9]{0,29})$/)
  .transform((v) => BigInt(v))
  .refine((v) => v <= MAX_AMOUNT, "amount is out of range");

const descriptor = z.object({
  payer: address,
  payee: address,
  operator: address,
  token: address,
  salt: hex32,
  authorizedSigner: address,
  expiringNonceHash: hex32,
});

// Session protocol v2 requires the channel descriptor in every action: the gateway learns the
// channel's payer, signer and deposit from it, never from its own guess.
const payloadSchema = z.discriminatedUnion("action", [
  z.object({
    action: z.literal("open"),
    type: z.literal("transaction"),
    channelId: hex32,
    transaction: hexBytes,
    signature: hexBytes,
    descriptor,
    cumulativeAmount: amount,
    authorizedSigner: address.optional(),
  }),
  z.object({
    action: z.literal("topUp"),
    type: z.literal("transaction"),
    channelId: hex32,
    transaction: hexBytes,
    descriptor,
    additionalDeposit: amount,
  }),
  z.object({
    action: z.literal("voucher"),
    channelId: hex32,
    descriptor,
    cumulativeAmount: amount,
    signature: hexBytes,
  }),
  z.object({
    action: z.literal("close"),
    channelId: hex32,
    descriptor,
    cumulativeAmount: amount,
    signature: hexBytes,
  }),
]);

/** A session payload with typed fields; the channel id is lowercase. */
export type SessionPayload = z.output<typeof payloadSchema> & { descriptor: ChannelDescriptor };

export type SessionAction = SessionPayload["action"];

const ACTIONS: ReadonlySet<unknown> = new Set(["open", "topUp", "voucher", "close"]);

/**
 * Parses the credential payload: mpp_method_unsupported for an action that is not a session
 * action, mpp_payment_verification_failed when a session payload's fields are invalid.
 */
export function parseSessionPayload(payload: Record<string, unknown>): SessionPayload {
  if (!ACTIONS.has(payload["action"])) {
    throw new PaymentError("mpp_method_unsupported", "credential is not a session payment");
  }
  const result = payloadSchema.safeParse(payload);
  if (!result.success) {
    throw new PaymentError("mpp_payment_verification_failed", "session credential payload is invalid");
  }
  const p = result.data;
  p.channelId = p.channelId.toLowerCase() as Hex;
  return p;
}

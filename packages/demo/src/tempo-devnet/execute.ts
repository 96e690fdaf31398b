import { Session } from "mppx/tempo";
import {
  type Abi,
  type Address,
  decodeFunctionData,
  domainSeparator,
  encodeAbiParameters,
  encodeErrorResult,
  encodeEventTopics,
  encodeFunctionResult,
  type Hex,
  hashTypedData,
  hexToBigInt,
  hexToNumber,
  keccak256,
  parseAbi,
  parseAbiParameters,
  size,
  slice,
  toHex,
  zeroAddress,
} from "viem";
import { Abis, Secp256k1 } from "viem/tempo";
import {
  CHANNEL_RESERVE,
  CLOSE_GRACE_PERIOD,
  FEE_MANAGER,
  knownToken,
  sameAddress,
  TOKEN_DECIMALS,
} from "./constants.js";
import type { ChannelDescriptor, ChannelRecord, WorldState } from "./state.js";

// The devnet's stand-ins for the system contracts a session touches: TIP-20 tokens, the TIP-1034
// channel reserve precompile and the fee manager. Calls decode and encode with the real ABIs
// (viem's TIP-20 ABI, mppx's escrow ABI), so return data, reverts and logs are byte-exact.

const escrowAbi = Session.Precompile.escrowAbi;
const tip20Abi = Abis.tip20;
const feeManagerAbi = Abis.feeManager;

/** TIP-1034 custom errors (the precompile's ITIP20ChannelReserve error set). */
const reserveErrorsAbi = parseAbi([
  "error ChannelAlreadyExists()",
  "error ChannelNotFound()",
  "error NotPayer()",
  "error NotPayeeOrOperator()",
  "error InvalidPayee()",
  "error ZeroDeposit()",
  "error ExpiringNonceHashNotSet()",
  "error InvalidSignature()",
  "error AmountExceedsDeposit()",
  "error AmountNotIncreasing()",
  "error CaptureAmountInvalid()",
  "error CloseNotReady()",
  "error DepositOverflow()",
]);
type ReserveError = (typeof reserveErrorsAbi)[number]["name"];

const solidityErrorAbi = parseAbi(["error Error(string)"]);

const UINT96_MAX = 2n ** 96n - 1n;
const SECP256K1_HALF_N = 0x7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0n;
const channelIdParameters = parseAbiParameters(
  "address, address, address, address, bytes32, address, bytes32, address, uint256",
);
const voucherTypes = {
  Voucher: [
    { name: "channelId", type: "bytes32" },
    { name: "cumulativeAmount", type: "uint96" },
  ],
} as const;

/** keccak256("Voucher(bytes32 channelId,uint96 cumulativeAmount)"). */
export const VOUCHER_TYPEHASH = keccak256(toHex("Voucher(bytes32 channelId,uint96 cumulativeAmount)"));

/** A call reverted: `data` is the ABI-encoded revert reason, `message` a readable name. */
export class Revert extends Error {
  constructor(
    readonly data: Hex,
    message: string,
  ) {
    super(message);
    this.name = "Revert";
  }
}

/** A log emitted during execution, before it is placed in a block. */
export interface LogEntry {
  address: Address;
  topics: Hex[];
  data: Hex;
}

/** Everything a call can see and change. */
export interface ExecutionContext {
  readonly state: WorldState;
  readonly sender: Address;
  readonly timestamp: bigint;
  readonly chainId: number;
  /** keccak256(encodeForSigning(tx) || sender), seeded by the enclosing transaction for open(). */
  readonly openContextHash: Hex | undefined;
  readonly logs: LogEntry[];
}

/** One call of a Tempo transaction (or of an eth_call). */
export interface Call {
  to?: Address | undefined;
  data?: Hex | undefined;
  value?: bigint | undefined;
}

/** Runs one call against the context's state; returns the return data or throws Revert. */
export function executeCall(ctx: ExecutionContext, call: Call): Hex {
  if ((call.value ?? 0n) !== 0n) throw revertWith("Tempo has no native value transfers");
  const to = call.to;
  if (to === undefined) throw revertWith("contract creation is not supported by the devnet");
  const data = call.data ?? "0x";
  if (knownToken(to)) return executeTip20(ctx, to, data);
  if (sameAddress(to, CHANNEL_RESERVE)) return executeReserve(ctx, data);
  if (sameAddress(to, FEE_MANAGER)) return executeFeeManager(data);
  // Any other address behaves like an account without code: the call succeeds and returns nothing.
  return "0x";
}

/** The TIP-1034 channel id of a descriptor on this chain. */
export function computeChannelId(descriptor: ChannelDescriptor, chainId: number): Hex {
  return keccak256(
    encodeAbiParameters(channelIdParameters, [
      descriptor.payer,
      descriptor.payee,
      descriptor.operator,
      descriptor.token,
      descriptor.salt,
      descriptor.authorizedSigner,
      descriptor.expiringNonceHash,
      CHANNEL_RESERVE,
      BigInt(chainId),
    ]),
  );
}

/** The EIP-712 digest a payer signs for a voucher (domain "TIP20 Channel Reserve", version "1"). */
export function voucherDigest(chainId: number, channelId: Hex, cumulativeAmount: bigint): Hex {
  return hashTypedData({
    domain: voucherDomain(chainId),
    types: voucherTypes,
    primaryType: "Voucher",
    message: { channelId, cumulativeAmount },
  });
}

/** Moves TIP-20 tokens between two holders, emitting Transfer; reverts on a short balance. */
export function moveTokens(
  ctx: ExecutionContext,
  token: Address,
  from: Address,
  to: Address,
  amount: bigint,
) {
  const available = ctx.state.balanceOf(token, from);
  if (available < amount) {
    throw new Revert(
      encodeErrorResult({
        abi: tip20Abi,
        errorName: "InsufficientBalance",
        args: [available, amount, token],
      }),
      "InsufficientBalance",
    );
  }
  ctx.state.setBalance(token, from, available - amount);
  ctx.state.setBalance(token, to, ctx.state.balanceOf(token, to) + amount);
  emit(ctx, token, tip20Abi, "Transfer", { from, to, amount });
}

function voucherDomain(chainId: number) {
  return {
    name: "TIP20 Channel Reserve",
    version: "1",
    chainId,
    verifyingContract: CHANNEL_RESERVE,
  } as const;
}

function revertWith(reason: string): Revert {
  return new Revert(encodeErrorResult({ abi: solidityErrorAbi, errorName: "Error", args: [reason] }), reason);
}

function reserveError(name: ReserveError): Revert {
  return new Revert(encodeErrorResult({ abi: reserveErrorsAbi, errorName: name }), name);
}

/** Appends an ABI-exact log: indexed arguments become topics, the rest the data. */
function emit(
  ctx: ExecutionContext,
  address: Address,
  abi: Abi,
  eventName: string,
  args: Record<string, unknown>,
) {
  const event = abi.find((item) => item.type === "event" && item.name === eventName);
  if (event?.type !== "event") throw new Error(`unknown event ${eventName}`);
  const topics = encodeEventTopics({ abi: [event], eventName, args } as never) as Hex[];
  const unindexed = event.inputs.filter((input) => !input.indexed);
  const data = encodeAbiParameters(
    unindexed,
    unindexed.map((input) => args[input.name ?? ""]),
  );
  ctx.logs.push({ address, topics, data });
}

function decodeOrRevert<const abi extends Abi>(abi: abi, data: Hex) {
  try {
    return decodeFunctionData({ abi, data });
  } catch {
    // No matching selector (or malformed arguments): revert without data, like a contract with no fallback.
    throw new Revert("0x", "unknown function selector or malformed calldata");
  }
}

function executeTip20(ctx: ExecutionContext, token: Address, data: Hex): Hex {
  const meta = knownToken(token)!;
  const call = decodeOrRevert(tip20Abi, data);
  const result = <const name extends string>(functionName: name, value: unknown): Hex =>
    encodeFunctionResult({ abi: tip20Abi, functionName, result: value } as never);
  switch (call.functionName) {
    case "name":
      return result("name", meta.name);
    case "symbol":
      return result("symbol", meta.symbol);
    case "decimals":
      return result("decimals", TOKEN_DECIMALS);
    case "currency":
      return result("currency", "USD");
    case "totalSupply":
      return result("totalSupply", ctx.state.totalSupply(token));
    case "balanceOf":
      return result("balanceOf", ctx.state.balanceOf(token, call.args[0]));
    case "allowance":
      return result("allowance", ctx.state.allowance(token, call.args[0], call.args[1]));
    case "transfer": {
      const [to, amount] = call.args;
      transferChecked(ctx, token, ctx.sender, to, amount);
      return result("transfer", true);
    }
    case "transferWithMemo": {
      const [to, amount, memo] = call.args;
      transferChecked(ctx, token, ctx.sender, to, amount);
      emit(ctx, token, tip20Abi, "TransferWithMemo", { from: ctx.sender, to, amount, memo });
      return "0x";
    }
    case "approve": {
      const [spender, amount] = call.args;
      ctx.state.setAllowance(token, ctx.sender, spender, amount);
      emit(ctx, token, tip20Abi, "Approval", { owner: ctx.sender, spender, amount });
      return result("approve", true);
    }
    case "transferFrom": {
      const [from, to, amount] = call.args;
      spendAllowance(ctx, token, from, amount);
      transferChecked(ctx, token, from, to, amount);
      return result("transferFrom", true);
    }
    case "transferFromWithMemo": {
      const [from, to, amount, memo] = call.args;
      spendAllowance(ctx, token, from, amount);
      transferChecked(ctx, token, from, to, amount);
      emit(ctx, token, tip20Abi, "TransferWithMemo", { from, to, amount, memo });
      return result("transferFromWithMemo", true);
    }
    default:
      throw revertWith(`TIP-20 ${call.functionName} is not supported by the devnet`);
  }
}

function transferChecked(ctx: ExecutionContext, token: Address, from: Address, to: Address, amount: bigint) {
  if (sameAddress(to, zeroAddress)) {
    throw new Revert(encodeErrorResult({ abi: tip20Abi, errorName: "InvalidRecipient" }), "InvalidRecipient");
  }
  moveTokens(ctx, token, from, to, amount);
}

function spendAllowance(ctx: ExecutionContext, token: Address, owner: Address, amount: bigint) {
  const allowed = ctx.state.allowance(token, owner, ctx.sender);
  if (allowed === 2n ** 256n - 1n) return;
  if (allowed < amount) {
    throw new Revert(
      encodeErrorResult({ abi: tip20Abi, errorName: "InsufficientAllowance" }),
      "InsufficientAllowance",
    );
  }
  ctx.state.setAllowance(token, owner, ctx.sender, allowed - amount);
}

function executeFeeManager(data: Hex): Hex {
  const call = decodeOrRevert(feeManagerAbi, data);
  // No account has chosen a fee token on the devnet; fees default to the transaction's feeToken.
  if (call.functionName === "userTokens" || call.functionName === "validatorTokens") {
    return encodeFunctionResult({ abi: feeManagerAbi, functionName: call.functionName, result: zeroAddress });
  }
  throw revertWith(`fee manager ${call.functionName} is not supported by the devnet`);
}

const zeroState = { settled: 0n, deposit: 0n, closeRequestedAt: 0 } as const;

function stateOf(record: ChannelRecord | undefined) {
  if (record === undefined || record.finalized) return zeroState;
  return { settled: record.settled, deposit: record.deposit, closeRequestedAt: record.closeRequestedAt };
}

/** The descriptor as the ABI decoder returns it, copied into our own type. */
function descriptorFrom(value: ChannelDescriptor): ChannelDescriptor {
  return {
    payer: value.payer,
    payee: value.payee,
    operator: value.operator,
    token: value.token,
    salt: value.salt,
    authorizedSigner: value.authorizedSigner,
    expiringNonceHash: value.expiringNonceHash,
  };
}

/** A channel that exists and is not finalized, with its id; reverts ChannelNotFound otherwise. */
function liveChannel(ctx: ExecutionContext, descriptor: ChannelDescriptor) {
  const channelId = computeChannelId(descriptor, ctx.chainId);
  const record = ctx.state.channel(channelId);
  if (record === undefined || record.finalized) throw reserveError("ChannelNotFound");
  return { channelId, record };
}

function requirePayeeOrOperator(ctx: ExecutionContext, descriptor: ChannelDescriptor) {
  const isPayee = sameAddress(ctx.sender, descriptor.payee);
  const isOperator =
    !sameAddress(descriptor.operator, zeroAddress) && sameAddress(ctx.sender, descriptor.operator);
  if (!isPayee && !isOperator) throw reserveError("NotPayeeOrOperator");
}

/** Checks a voucher signature against authorizedSigner, or the payer when that is zero. */
function requireVoucherSignature(
  ctx: ExecutionContext,
  channelId: Hex,
  descriptor: ChannelDescriptor,
  cumulativeAmount: bigint,
  signature: Hex,
) {
  const expected = sameAddress(descriptor.authorizedSigner, zeroAddress)
    ? descriptor.payer
    : descriptor.authorizedSigner;
  const signer = recoverVoucherSigner(voucherDigest(ctx.chainId, channelId, cumulativeAmount), signature);
  if (!sameAddress(signer, expected)) throw reserveError("InvalidSignature");
}

/**
 * Recovers the signer of a 65-byte r||s||v secp256k1 signature (v = 27 or 28, low s). Other
 * TIP-1020 envelopes (p256, webAuthn, keychain) are not supported by the devnet.
 */
function recoverVoucherSigner(digest: Hex, signature: Hex): Address | undefined {
  if (size(signature) !== 65) return undefined;
  const r = hexToBigInt(slice(signature, 0, 32));
  const s = hexToBigInt(slice(signature, 32, 64));
  const v = hexToNumber(slice(signature, 64, 65));
  if ((v !== 27 && v !== 28) || r === 0n || s === 0n || s > SECP256K1_HALF_N) return undefined;
  try {
    return Secp256k1.recoverAddress({ payload: digest, signature: { r, s, yParity: v - 27 } });
  } catch {
    return undefined;
  }
}

function executeReserve(ctx: ExecutionContext, data: Hex): Hex {
  const call = decodeOrRevert(escrowAbi, data);
  const result = <const name extends string>(functionName: name, value: unknown): Hex =>
    encodeFunctionResult({ abi: escrowAbi, functionName, result: value } as never);
  switch (call.functionName) {
    case "CLOSE_GRACE_PERIOD":
      return result("CLOSE_GRACE_PERIOD", CLOSE_GRACE_PERIOD);
    case "VOUCHER_TYPEHASH":
      return result("VOUCHER_TYPEHASH", VOUCHER_TYPEHASH);
    case "domainSeparator":
      return result("domainSeparator", domainSeparator({ domain: voucherDomain(ctx.chainId) }));
    case "getVoucherDigest":
      return result("getVoucherDigest", voucherDigest(ctx.chainId, call.args[0], call.args[1]));
    case "computeChannelId": {
      const [payer, payee, operator, token, salt, authorizedSigner, expiringNonceHash] = call.args;
      const descriptor = { payer, payee, operator, token, salt, authorizedSigner, expiringNonceHash };
      return result("computeChannelId", computeChannelId(descriptor, ctx.chainId));
    }
    case "getChannel": {
      const descriptor = descriptorFrom(call.args[0]);
      const record = ctx.state.channel(computeChannelId(descriptor, ctx.chainId));
      return result("getChannel", { descriptor, state: stateOf(record) });
    }
    case "getChannelState":
      return result("getChannelState", stateOf(ctx.state.channel(call.args[0])));
    case "getChannelStatesBatch":
      return result(
        "getChannelStatesBatch",
        call.args[0].map((channelId) => stateOf(ctx.state.channel(channelId))),
      );
    case "open": {
      const [payee, operator, token, deposit, salt, authorizedSigner] = call.args;
      return result("open", open(ctx, { payee, operator, token, deposit, salt, authorizedSigner }));
    }
    case "topUp":
      topUp(ctx, descriptorFrom(call.args[0]), call.args[1]);
      return "0x";
    case "settle":
      settle(ctx, descriptorFrom(call.args[0]), call.args[1], call.args[2]);
      return "0x";
    case "close":
      close(ctx, descriptorFrom(call.args[0]), call.args[1], call.args[2], call.args[3]);
      return "0x";
    case "requestClose":
      requestClose(ctx, descriptorFrom(call.args[0]));
      return "0x";
    case "withdraw":
      withdraw(ctx, descriptorFrom(call.args[0]));
      return "0x";
  }
}

function open(
  ctx: ExecutionContext,
  args: {
    payee: Address;
    operator: Address;
    token: Address;
    deposit: bigint;
    salt: Hex;
    authorizedSigner: Address;
  },
): Hex {
  if (ctx.openContextHash === undefined) throw reserveError("ExpiringNonceHashNotSet");
  if (args.deposit === 0n) throw reserveError("ZeroDeposit");
  if (sameAddress(args.payee, zeroAddress)) throw reserveError("InvalidPayee");
  if (!knownToken(args.token)) throw revertWith("channel token is not a TIP-20 token known to the devnet");
  const descriptor: ChannelDescriptor = {
    payer: ctx.sender,
    payee: args.payee,
    operator: args.operator,
    token: args.token,
    salt: args.salt,
    authorizedSigner: args.authorizedSigner,
    expiringNonceHash: ctx.openContextHash,
  };
  const channelId = computeChannelId(descriptor, ctx.chainId);
  // A finalized channel keeps its slot: the same id can never be opened twice.
  if (ctx.state.channel(channelId) !== undefined) throw reserveError("ChannelAlreadyExists");
  moveTokens(ctx, args.token, ctx.sender, CHANNEL_RESERVE, args.deposit);
  ctx.state.setChannel(channelId, {
    descriptor,
    settled: 0n,
    deposit: args.deposit,
    closeRequestedAt: 0,
    finalized: false,
  });
  emit(ctx, CHANNEL_RESERVE, escrowAbi, "ChannelOpened", {
    channelId,
    payer: descriptor.payer,
    payee: descriptor.payee,
    operator: descriptor.operator,
    token: descriptor.token,
    authorizedSigner: descriptor.authorizedSigner,
    salt: descriptor.salt,
    expiringNonceHash: descriptor.expiringNonceHash,
    deposit: args.deposit,
  });
  return channelId;
}

function topUp(ctx: ExecutionContext, descriptor: ChannelDescriptor, additionalDeposit: bigint) {
  const { channelId, record } = liveChannel(ctx, descriptor);
  if (!sameAddress(ctx.sender, descriptor.payer)) throw reserveError("NotPayer");
  if (additionalDeposit === 0n) throw reserveError("ZeroDeposit");
  const newDeposit = record.deposit + additionalDeposit;
  if (newDeposit > UINT96_MAX) throw reserveError("DepositOverflow");
  moveTokens(ctx, descriptor.token, ctx.sender, CHANNEL_RESERVE, additionalDeposit);
  const parties = { channelId, payer: descriptor.payer, payee: descriptor.payee };
  if (record.closeRequestedAt !== 0) emit(ctx, CHANNEL_RESERVE, escrowAbi, "CloseRequestCancelled", parties);
  ctx.state.setChannel(channelId, { ...record, deposit: newDeposit, closeRequestedAt: 0 });
  emit(ctx, CHANNEL_RESERVE, escrowAbi, "TopUp", { ...parties, additionalDeposit, newDeposit });
}

function settle(
  ctx: ExecutionContext,
  descriptor: ChannelDescriptor,
  cumulativeAmount: bigint,
  signature: Hex,
) {
  const { channelId, record } = liveChannel(ctx, descriptor);
  requirePayeeOrOperator(ctx, descriptor);
  if (cumulativeAmount <= record.settled) throw reserveError("AmountNotIncreasing");
  if (cumulativeAmount > record.deposit) throw reserveError("AmountExceedsDeposit");
  requireVoucherSignature(ctx, channelId, descriptor, cumulativeAmount, signature);
  const deltaPaid = cumulativeAmount - record.settled;
  moveTokens(ctx, descriptor.token, CHANNEL_RESERVE, descriptor.payee, deltaPaid);
  ctx.state.setChannel(channelId, { ...record, settled: cumulativeAmount });
  emit(ctx, CHANNEL_RESERVE, escrowAbi, "Settled", {
    channelId,
    payer: descriptor.payer,
    payee: descriptor.payee,
    cumulativeAmount,
    deltaPaid,
    newSettled: cumulativeAmount,
  });
}

/**
 * Cooperative close: pays the payee up to `captureAmount` (settled ≤ capture ≤ cumulative ≤ …
 * deposit), refunds the rest of the deposit to the payer and finalizes. The voucher signature is
 * checked whenever the close pays anything beyond what is already settled.
 */
function close(
  ctx: ExecutionContext,
  descriptor: ChannelDescriptor,
  cumulativeAmount: bigint,
  captureAmount: bigint,
  signature: Hex,
) {
  const { channelId, record } = liveChannel(ctx, descriptor);
  requirePayeeOrOperator(ctx, descriptor);
  if (captureAmount < record.settled || captureAmount > cumulativeAmount) {
    throw reserveError("CaptureAmountInvalid");
  }
  if (captureAmount > record.deposit) throw reserveError("AmountExceedsDeposit");
  if (captureAmount > record.settled) {
    requireVoucherSignature(ctx, channelId, descriptor, cumulativeAmount, signature);
  }
  const refund = record.deposit - captureAmount;
  finalize(ctx, channelId, record, captureAmount, refund);
}

function requestClose(ctx: ExecutionContext, descriptor: ChannelDescriptor) {
  const { channelId, record } = liveChannel(ctx, descriptor);
  if (!sameAddress(ctx.sender, descriptor.payer)) throw reserveError("NotPayer");
  // A second request keeps the first grace period running.
  if (record.closeRequestedAt !== 0) return;
  ctx.state.setChannel(channelId, { ...record, closeRequestedAt: Number(ctx.timestamp) });
  emit(ctx, CHANNEL_RESERVE, escrowAbi, "CloseRequested", {
    channelId,
    payer: descriptor.payer,
    payee: descriptor.payee,
    closeGraceEnd: ctx.timestamp + CLOSE_GRACE_PERIOD,
  });
}

function withdraw(ctx: ExecutionContext, descriptor: ChannelDescriptor) {
  const { channelId, record } = liveChannel(ctx, descriptor);
  if (!sameAddress(ctx.sender, descriptor.payer)) throw reserveError("NotPayer");
  if (record.closeRequestedAt === 0 || ctx.timestamp < BigInt(record.closeRequestedAt) + CLOSE_GRACE_PERIOD) {
    throw reserveError("CloseNotReady");
  }
  finalize(ctx, channelId, record, record.settled, record.deposit - record.settled);
}

/** Pays the payee up to `totalToPayee`, refunds `refund` to the payer, emits ChannelClosed. */
function finalize(
  ctx: ExecutionContext,
  channelId: Hex,
  record: ChannelRecord,
  totalToPayee: bigint,
  refund: bigint,
) {
  const { descriptor } = record;
  const delta = totalToPayee - record.settled;
  if (delta > 0n) moveTokens(ctx, descriptor.token, CHANNEL_RESERVE, descriptor.payee, delta);
  if (refund > 0n) moveTokens(ctx, descriptor.token, CHANNEL_RESERVE, descriptor.payer, refund);
  ctx.state.setChannel(channelId, { ...record, settled: totalToPayee, finalized: true });
  emit(ctx, CHANNEL_RESERVE, escrowAbi, "ChannelClosed", {
    channelId,
    payer: descriptor.payer,
    payee: descriptor.payee,
    settledToPayee: totalToPayee,
    refundedToPayer: refund,
  });
}

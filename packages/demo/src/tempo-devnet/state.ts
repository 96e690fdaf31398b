import type { Address, Hex } from "viem";

/** TIP-1034 channel descriptor: the immutable half of a channel, hashed into its id. */
export interface ChannelDescriptor {
  payer: Address;
  payee: Address;
  operator: Address;
  token: Address;
  salt: Hex;
  authorizedSigner: Address;
  expiringNonceHash: Hex;
}

/** A channel as the devnet's reserve precompile stores it. Records are replaced, never mutated. */
export interface ChannelRecord {
  readonly descriptor: ChannelDescriptor;
  readonly settled: bigint;
  readonly deposit: bigint;
  /** Block timestamp of the payer's requestClose, 0 when none is pending. */
  readonly closeRequestedAt: number;
  /** Closed or withdrawn: the on-chain state reads as zero and the id can never be opened again. */
  readonly finalized: boolean;
}

function pairKey(a: string, b: string): string {
  return `${a.toLowerCase()}|${b.toLowerCase()}`;
}

/**
 * The whole world state of the devnet: TIP-20 balances and allowances, channel records and
 * account nonces. A transaction runs on a clone and the clone replaces the state only when the
 * transaction commits; committed states are kept per block for block-pinned reads.
 */
export class WorldState {
  private constructor(
    private readonly balances: Map<string, bigint>,
    private readonly allowances: Map<string, bigint>,
    private readonly channels: Map<string, ChannelRecord>,
    private readonly nonces: Map<string, bigint>,
  ) {}

  static empty(): WorldState {
    return new WorldState(new Map(), new Map(), new Map(), new Map());
  }

  /** A copy whose changes do not affect this state (channel records are immutable values). */
  clone(): WorldState {
    return new WorldState(
      new Map(this.balances),
      new Map(this.allowances),
      new Map(this.channels),
      new Map(this.nonces),
    );
  }

  balanceOf(token: Address, holder: Address): bigint {
    return this.balances.get(pairKey(token, holder)) ?? 0n;
  }

  setBalance(token: Address, holder: Address, amount: bigint): void {
    this.balances.set(pairKey(token, holder), amount);
  }

  totalSupply(token: Address): bigint {
    const prefix = `${token.toLowerCase()}|`;
    let total = 0n;
    for (const [key, amount] of this.balances) if (key.startsWith(prefix)) total += amount;
    return total;
  }

  allowance(token: Address, owner: Address, spender: Address): bigint {
    return this.allowances.get(`${pairKey(token, owner)}|${spender.toLowerCase()}`) ?? 0n;
  }

  setAllowance(token: Address, owner: Address, spender: Address, amount: bigint): void {
    this.allowances.set(`${pairKey(token, owner)}|${spender.toLowerCase()}`, amount);
  }

  channel(channelId: Hex): ChannelRecord | undefined {
    return this.channels.get(channelId.toLowerCase());
  }

  setChannel(channelId: Hex, record: ChannelRecord): void {
    this.channels.set(channelId.toLowerCase(), record);
  }

  /** The next nonce of `account` in the 2D nonce lane `nonceKey` (0 is the protocol nonce). */
  nonce(account: Address, nonceKey: bigint): bigint {
    return this.nonces.get(pairKey(account, nonceKey.toString(16))) ?? 0n;
  }

  setNonce(account: Address, nonceKey: bigint, next: bigint): void {
    this.nonces.set(pairKey(account, nonceKey.toString(16)), next);
  }
}

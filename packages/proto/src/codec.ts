// The one way every Tollgate message becomes protobuf bytes and back: a plan per message type,
// built once from the generated descriptor.
//
// protobuf-es walks a message through its reflection API field by field: `toBinary` builds chunks
// that it copies together at the end (after `create` copied an init shape into a full message),
// `fromBinary` sets each field through the same API. On the stack's request path that was the
// largest protobuf cost, about 28 µs a request in api-edge alone under load
// (docs/performance.md, "Protobuf encoding"). Here `encodeMessage` measures a message (or its
// init shape) and writes it into one buffer of that size, with protobuf-es's exact bytes: fields
// in field-number order, proto3's implicit fields only when not their zero value, explicit ones
// (`optional`, messages, a oneof's case) when set, repeated numbers and enums packed.
// `decodeMessage` reads bytes into protobuf-es's own zero message, each field as `fromBinary`
// sets it. Anything outside the subset the plans cover (maps, floating point, fixed-width or
// zig-zag numbers, groups, wrapper types, int64 as string, closed enums), unknown fields, a
// message field sent twice, malformed bytes, and any value of an unexpected type or range go to
// protobuf-es whole, so no input is written or read differently (codec.test.ts compares both
// ways on every message of this package).
import {
  create,
  type DescField,
  type DescMessage,
  fromBinary,
  type MessageInitShape,
  type MessageShape,
  ScalarType,
  toBinary,
} from "@bufbuild/protobuf";
import { getTextEncoding } from "@bufbuild/protobuf/wire";

/** How one field is written and read. */
interface FieldPlan {
  number: number;
  /** The field's tag (number and wire type) as its varint bytes. */
  tag: Uint8Array;
  /** Where its value is: the property, or the oneof's property whose `case` names it. */
  localName: string;
  oneof?: string;
  /** Written whenever set, zero values too (optional, message, oneof case). */
  explicit: boolean;
  kind: "scalar" | "message" | "list-scalar" | "list-message";
  /** The scalar type of a scalar or list of scalars (enums are INT32 on the wire). */
  scalar?: ScalarType;
  /** Strings checked to be UTF-8 when read, as protobuf-es checks proto3 strings. */
  strictUtf8: boolean;
  message?: DescMessage;
}

/** A message type's fields in field-number order; undefined when the type is not covered. */
type Plan = readonly FieldPlan[] | undefined;

const plans = new WeakMap<DescMessage, Plan | "building">();

/** The scalar types the plan writes; every other one sends the whole message to protobuf-es. */
const COVERED: ReadonlySet<ScalarType> = new Set([
  ScalarType.STRING,
  ScalarType.BYTES,
  ScalarType.BOOL,
  ScalarType.UINT32,
  ScalarType.INT32,
  ScalarType.UINT64,
  ScalarType.INT64,
]);

const WIRE_VARINT = 0;
const WIRE_LENGTH = 2;

function varintBytes(n: number): Uint8Array {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return Uint8Array.from(out);
}

function fieldPlan(f: DescField): FieldPlan | undefined {
  const common = {
    number: f.number,
    localName: f.localName,
    ...(f.oneof ? { oneof: f.oneof.localName } : {}),
    strictUtf8: "utf8Validation" in f && f.utf8Validation === true,
  };
  const tagOf = (wire: number) => varintBytes(((f.number << 3) | wire) >>> 0);
  const messagePlan = (kind: "message" | "list-message", desc: DescMessage, delimited: boolean) =>
    delimited || !coveredMessage(desc)
      ? undefined
      : { ...common, tag: tagOf(WIRE_LENGTH), explicit: true, kind, message: desc };
  switch (f.fieldKind) {
    case "scalar":
    case "enum": {
      // A closed enum keeps an unknown number among the unknown fields: protobuf-es does that.
      if (f.fieldKind === "enum" && !f.enum.open) return undefined;
      const scalar = f.fieldKind === "enum" ? ScalarType.INT32 : f.scalar;
      if (!COVERED.has(scalar) || (f.fieldKind === "scalar" && f.longAsString)) return undefined;
      const length = scalar === ScalarType.STRING || scalar === ScalarType.BYTES;
      return {
        ...common,
        tag: tagOf(length ? WIRE_LENGTH : WIRE_VARINT),
        explicit: f.oneof !== undefined || f.presence !== IMPLICIT,
        kind: "scalar",
        scalar,
      };
    }
    case "message":
      return messagePlan("message", f.message, f.delimitedEncoding);
    case "list": {
      if (f.listKind === "message") return messagePlan("list-message", f.message, f.delimitedEncoding);
      if (f.listKind === "enum" && !f.enum.open) return undefined;
      const scalar = f.listKind === "enum" ? ScalarType.INT32 : f.scalar;
      if (!COVERED.has(scalar) || (f.listKind === "scalar" && f.longAsString)) return undefined;
      const length = scalar === ScalarType.STRING || scalar === ScalarType.BYTES;
      // Numbers are written packed (one length-delimited run), strings and bytes one by one.
      if (!length && !f.packed) return undefined;
      return { ...common, tag: tagOf(WIRE_LENGTH), explicit: true, kind: "list-scalar", scalar };
    }
    default:
      return undefined;
  }
}

/** proto3's implicit presence (FeatureSet.FieldPresence.IMPLICIT). */
const IMPLICIT = 2;

/** google.protobuf types the plan writes as plain messages (wrappers and Struct are not plain). */
const PLAIN_WELL_KNOWN = new Set(["google.protobuf.Timestamp", "google.protobuf.Duration"]);

function coveredMessage(desc: DescMessage): boolean {
  if (desc.typeName.startsWith("google.protobuf.") && !PLAIN_WELL_KNOWN.has(desc.typeName)) return false;
  // A type that refers to itself is covered if the rest of it is.
  return planOf(desc) !== undefined;
}

function planOf(desc: DescMessage): Plan {
  const known = plans.get(desc);
  if (known === "building") return [];
  if (known !== undefined || plans.has(desc)) return known as Plan;
  plans.set(desc, "building");
  const fields: FieldPlan[] = [];
  let covered = true;
  for (const f of [...desc.fields].sort((a, b) => a.number - b.number)) {
    const p = fieldPlan(f);
    if (!p) {
      covered = false;
      break;
    }
    fields.push(p);
  }
  const plan = covered ? fields : undefined;
  plans.set(desc, plan);
  return plan;
}

/** Thrown inside the writer or reader at anything the plan does not cover; the caller falls back. */
const NOT_COVERED = Symbol("not covered");

const UINT32_MAX = 0xffff_ffff;
const INT32_MIN = -0x8000_0000;
const INT32_MAX = 0x7fff_ffff;
const UINT64_MAX = (1n << 64n) - 1n;
const INT64_MIN = -(1n << 63n);
const INT64_MAX = (1n << 63n) - 1n;

type Fields = Record<string, unknown>;

/** The value of a field in a message or init shape; undefined when it is not set. */
function valueIn(msg: Fields, p: FieldPlan): unknown {
  if (p.oneof === undefined) return msg[p.localName];
  const sel = msg[p.oneof] as { case?: unknown; value?: unknown } | undefined;
  return sel && sel.case === p.localName ? sel.value : undefined;
}

/** Whether a set value is written: explicit fields always, implicit ones when not zero. */
function written(p: FieldPlan, v: unknown): boolean {
  if (v === undefined || v === null) return false;
  if (p.explicit) return true;
  switch (p.scalar) {
    case ScalarType.STRING:
      return v !== "";
    case ScalarType.BYTES:
      return (v as Uint8Array).length > 0;
    case ScalarType.BOOL:
      return v !== false;
    case ScalarType.UINT64:
    case ScalarType.INT64:
      return v !== 0n;
    default:
      return v !== 0;
  }
}

function varintSize(n: number): number {
  return n < 0x80 ? 1 : n < 0x4000 ? 2 : n < 0x20_0000 ? 3 : n < 0x1000_0000 ? 4 : 5;
}

function bigVarintSize(n: bigint): number {
  let size = 1;
  while (n > 0x7fn) {
    n >>= 7n;
    size++;
  }
  return size;
}

/** The bytes a scalar's value takes after its tag (with its length prefix where it has one). */
function scalarSize(scalar: ScalarType, v: unknown): number {
  switch (scalar) {
    case ScalarType.STRING: {
      if (typeof v !== "string") throw NOT_COVERED;
      const n = Buffer.byteLength(v, "utf8");
      return varintSize(n) + n;
    }
    case ScalarType.BYTES:
      if (!(v instanceof Uint8Array)) throw NOT_COVERED;
      return varintSize(v.length) + v.length;
    case ScalarType.BOOL:
      if (typeof v !== "boolean") throw NOT_COVERED;
      return 1;
    case ScalarType.UINT32:
      if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > UINT32_MAX) throw NOT_COVERED;
      return varintSize(v);
    case ScalarType.INT32:
      if (typeof v !== "number" || !Number.isInteger(v) || v < INT32_MIN || v > INT32_MAX) throw NOT_COVERED;
      return v < 0 ? 10 : varintSize(v);
    case ScalarType.UINT64:
      if (typeof v !== "bigint" || v < 0n || v > UINT64_MAX) throw NOT_COVERED;
      return bigVarintSize(v);
    case ScalarType.INT64:
      if (typeof v !== "bigint" || v < INT64_MIN || v > INT64_MAX) throw NOT_COVERED;
      return bigVarintSize(BigInt.asUintN(64, v));
    default:
      throw NOT_COVERED;
  }
}

/**
 * Two passes over a message: `size` computes every nested message's length (in the order the
 * write pass needs them), `write` fills the buffer.
 */
class Writer {
  private readonly lengths: number[] = [];
  private next = 0;
  private buf!: Buffer;
  private pos = 0;

  encode(plan: readonly FieldPlan[], msg: Fields): Uint8Array {
    const total = this.size(plan, msg);
    this.buf = Buffer.allocUnsafe(total);
    this.write(plan, msg);
    return this.buf;
  }

  private size(plan: readonly FieldPlan[], msg: Fields): number {
    if (typeof msg !== "object" || msg === null) throw NOT_COVERED;
    const unknown = (msg as { $unknown?: unknown[] }).$unknown;
    if (unknown !== undefined && unknown.length > 0) throw NOT_COVERED;
    let total = 0;
    for (const p of plan) {
      const v = valueIn(msg, p);
      if (!written(p, v)) continue;
      switch (p.kind) {
        case "scalar":
          total += p.tag.length + scalarSize(p.scalar!, v);
          break;
        case "message":
          total += p.tag.length + this.nested(p.message!, v);
          break;
        case "list-message":
          if (!Array.isArray(v)) throw NOT_COVERED;
          for (const item of v) total += p.tag.length + this.nested(p.message!, item);
          break;
        case "list-scalar": {
          if (!Array.isArray(v)) throw NOT_COVERED;
          if (p.scalar === ScalarType.STRING || p.scalar === ScalarType.BYTES) {
            for (const item of v) total += p.tag.length + scalarSize(p.scalar!, item);
          } else if (v.length > 0) {
            let run = 0;
            for (const item of v) run += scalarSize(p.scalar!, item);
            this.lengths.push(run);
            total += p.tag.length + varintSize(run) + run;
          }
          break;
        }
      }
    }
    return total;
  }

  /** A nested message's length-prefixed size; its length is kept for the write pass. */
  private nested(desc: DescMessage, v: unknown): number {
    const plan = planOf(desc);
    if (!plan) throw NOT_COVERED;
    const at = this.lengths.length;
    this.lengths.push(0);
    const n = this.size(plan, v as Fields);
    this.lengths[at] = n;
    return varintSize(n) + n;
  }

  private write(plan: readonly FieldPlan[], msg: Fields): void {
    for (const p of plan) {
      const v = valueIn(msg, p);
      if (!written(p, v)) continue;
      switch (p.kind) {
        case "scalar":
          this.bytes(p.tag);
          this.scalar(p.scalar!, v);
          break;
        case "message":
          this.bytes(p.tag);
          this.message(p.message!, v as Fields);
          break;
        case "list-message":
          for (const item of v as Fields[]) {
            this.bytes(p.tag);
            this.message(p.message!, item);
          }
          break;
        case "list-scalar":
          if (p.scalar === ScalarType.STRING || p.scalar === ScalarType.BYTES) {
            for (const item of v as unknown[]) {
              this.bytes(p.tag);
              this.scalar(p.scalar!, item);
            }
          } else if ((v as unknown[]).length > 0) {
            this.bytes(p.tag);
            this.varint(this.lengths[this.next++]!);
            for (const item of v as unknown[]) this.scalar(p.scalar!, item);
          }
          break;
      }
    }
  }

  private message(desc: DescMessage, msg: Fields): void {
    this.varint(this.lengths[this.next++]!);
    this.write(planOf(desc)!, msg);
  }

  private scalar(scalar: ScalarType, v: unknown): void {
    switch (scalar) {
      case ScalarType.STRING: {
        const s = v as string;
        const n = Buffer.byteLength(s, "utf8");
        this.varint(n);
        this.pos += this.buf.write(s, this.pos, n, "utf8");
        break;
      }
      case ScalarType.BYTES: {
        const b = v as Uint8Array;
        this.varint(b.length);
        this.buf.set(b, this.pos);
        this.pos += b.length;
        break;
      }
      case ScalarType.BOOL:
        this.buf[this.pos++] = v ? 1 : 0;
        break;
      case ScalarType.UINT32:
        this.varint(v as number);
        break;
      case ScalarType.INT32:
        if ((v as number) < 0) this.bigVarint(BigInt.asUintN(64, BigInt(v as number)));
        else this.varint(v as number);
        break;
      case ScalarType.UINT64:
        this.bigVarint(v as bigint);
        break;
      case ScalarType.INT64:
        this.bigVarint(BigInt.asUintN(64, v as bigint));
        break;
    }
  }

  private bytes(b: Uint8Array): void {
    for (let i = 0; i < b.length; i++) this.buf[this.pos++] = b[i]!;
  }

  private varint(n: number): void {
    while (n > 0x7f) {
      this.buf[this.pos++] = (n & 0x7f) | 0x80;
      n >>>= 7;
    }
    this.buf[this.pos++] = n;
  }

  private bigVarint(n: bigint): void {
    while (n > 0x7fn) {
      this.buf[this.pos++] = Number(n & 0x7fn) | 0x80;
      n >>= 7n;
    }
    this.buf[this.pos++] = Number(n);
  }
}

/** Whether messages of this type are written and read by a plan (not handed to protobuf-es whole). */
export function planned(schema: DescMessage): boolean {
  return planOf(schema) !== undefined;
}

/** The plan's bytes for a message or init shape; undefined when the plan does not write it. */
export function writePlanned<Desc extends DescMessage>(
  schema: Desc,
  init: MessageInitShape<Desc>,
): Uint8Array | undefined {
  const plan = planOf(schema);
  if (!plan) return undefined;
  try {
    return new Writer().encode(plan, init as Fields);
  } catch (err) {
    if (err !== NOT_COVERED) throw err;
    return undefined;
  }
}

/**
 * The protobuf bytes of a message or of its init shape, as
 * `toBinary(schema, create(schema, init))` writes them.
 */
export function encodeMessage<Desc extends DescMessage>(
  schema: Desc,
  init: MessageInitShape<Desc>,
): Uint8Array {
  return writePlanned(schema, init) ?? toBinary(schema, create(schema, init));
}

const readPlans = new WeakMap<DescMessage, ReadonlyMap<number, FieldPlan> | undefined>();

/** A covered type's field plans by number, for reading. */
function readPlanOf(desc: DescMessage): ReadonlyMap<number, FieldPlan> | undefined {
  if (readPlans.has(desc)) return readPlans.get(desc);
  const plan = planOf(desc);
  const byNumber = plan ? new Map(plan.map((p) => [p.number, p] as const)) : undefined;
  readPlans.set(desc, byNumber);
  return byNumber;
}

/** The low and high 32 bits of the last varint read. */
let lo = 0;
let hi = 0;

/** Reads protobuf bytes into the message protobuf-es's `fromBinary` gives for them. */
class Reader {
  private pos = 0;
  private readonly decodeUtf8 = getTextEncoding().decodeUtf8;

  constructor(private readonly buf: Uint8Array) {}

  message(desc: DescMessage, end: number): Fields {
    const plan = readPlanOf(desc);
    if (!plan) throw NOT_COVERED;
    // protobuf-es's own zero message, so the shape (defaults, absent fields) is its shape.
    const msg = create(desc) as unknown as Fields;
    while (this.pos < end) {
      this.varint();
      if (hi !== 0) throw NOT_COVERED;
      const no = lo >>> 3;
      const wire = lo & 7;
      const p = plan.get(no);
      if (!p) throw NOT_COVERED; // unknown fields are kept by protobuf-es: let it read them
      let value: unknown;
      switch (p.kind) {
        case "scalar":
          value = this.scalar(p, wire);
          break;
        case "message": {
          if (wire !== WIRE_LENGTH) throw NOT_COVERED;
          // A second occurrence is merged into the first by protobuf-es.
          if ((p.oneof === undefined ? msg[p.localName] : undefined) !== undefined) throw NOT_COVERED;
          const sel = p.oneof === undefined ? undefined : (msg[p.oneof] as { case?: string });
          if (sel?.case === p.localName) throw NOT_COVERED;
          value = this.message(p.message!, this.lengthEnd());
          break;
        }
        case "list-message":
          if (wire !== WIRE_LENGTH) throw NOT_COVERED;
          (msg[p.localName] as unknown[]).push(this.message(p.message!, this.lengthEnd()));
          continue;
        case "list-scalar": {
          const list = msg[p.localName] as unknown[];
          const text = p.scalar === ScalarType.STRING || p.scalar === ScalarType.BYTES;
          if (wire === WIRE_LENGTH && !text) {
            const runEnd = this.lengthEnd();
            while (this.pos < runEnd) list.push(this.scalar(p, WIRE_VARINT));
            if (this.pos !== runEnd) throw NOT_COVERED;
          } else list.push(this.scalar(p, wire));
          continue;
        }
      }
      if (p.oneof === undefined) msg[p.localName] = value;
      else msg[p.oneof] = { case: p.localName, value };
    }
    if (this.pos !== end) throw NOT_COVERED;
    return msg;
  }

  private scalar(p: FieldPlan, wire: number): unknown {
    switch (p.scalar) {
      case ScalarType.STRING: {
        if (wire !== WIRE_LENGTH) throw NOT_COVERED;
        const end = this.lengthEnd();
        const text = this.decodeUtf8(this.buf.subarray(this.pos, end), p.strictUtf8);
        this.pos = end;
        return text;
      }
      case ScalarType.BYTES: {
        if (wire !== WIRE_LENGTH) throw NOT_COVERED;
        const end = this.lengthEnd();
        const bytes = this.buf.subarray(this.pos, end);
        this.pos = end;
        return bytes;
      }
      default:
        if (wire !== WIRE_VARINT) throw NOT_COVERED;
        this.varint();
        switch (p.scalar) {
          case ScalarType.BOOL:
            return lo !== 0 || hi !== 0;
          case ScalarType.UINT32:
            return lo >>> 0;
          case ScalarType.INT32:
            return lo | 0;
          case ScalarType.UINT64:
            return (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0);
          case ScalarType.INT64:
            return BigInt.asIntN(64, (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0));
          default:
            throw NOT_COVERED;
        }
    }
  }

  /** Reads a length prefix; the position where that many bytes end. */
  private lengthEnd(): number {
    this.varint();
    if (hi !== 0 || lo < 0) throw NOT_COVERED;
    const end = this.pos + lo;
    if (end > this.buf.length) throw NOT_COVERED;
    return end;
  }

  /** Reads a varint of at most 10 bytes into `lo` and `hi`. */
  private varint(): void {
    let low = 0;
    let high = 0;
    for (let shift = 0; shift < 70; shift += 7) {
      if (this.pos >= this.buf.length) throw NOT_COVERED;
      const b = this.buf[this.pos++]!;
      const bits = b & 0x7f;
      if (shift < 28) low |= bits << shift;
      else if (shift === 28) {
        low |= (bits & 0x0f) << 28;
        high |= bits >>> 4;
      } else high |= bits << (shift - 32);
      if ((b & 0x80) === 0) {
        lo = low;
        hi = high;
        return;
      }
    }
    throw NOT_COVERED;
  }

  read(desc: DescMessage): Fields {
    return this.message(desc, this.buf.length);
  }
}

/** The plan's reading of these bytes; undefined when the plan does not read them. */
export function readPlanned<Desc extends DescMessage>(
  schema: Desc,
  bytes: Uint8Array,
): MessageShape<Desc> | undefined {
  if (!readPlanOf(schema)) return undefined;
  try {
    return new Reader(bytes).read(schema) as unknown as MessageShape<Desc>;
  } catch (err) {
    if (err !== NOT_COVERED) throw err;
    return undefined;
  }
}

/**
 * The message protobuf-es's `fromBinary` reads from these bytes: the same fields, values and
 * shape. Bytes the plan does not read (unknown fields, a message field sent twice, anything
 * malformed) go to protobuf-es whole, which also gives its own error for malformed input.
 */
export function decodeMessage<Desc extends DescMessage>(schema: Desc, bytes: Uint8Array): MessageShape<Desc> {
  return readPlanned(schema, bytes) ?? fromBinary(schema, bytes);
}

/**
 * The wire format of hops and replies, as the Python models write and read it
 * (hookbus.bus.envelopes): each stream entry has a field `e` with the envelope's JSON;
 * a version 2 hook hop carries the Context JSON in `c` and the HookData JSON in `d`, and
 * its reply carries `d` only when the hooks changed the data. Python dumps envelopes with
 * `exclude_none`, so absent and null are the same to it; this module omits nulls too.
 */

import type { ChunkText } from './chunkBatch.js';

export const VERSION = 1;
export const SPLIT_VERSION = 2;
export { PROTOCOL } from '../generated/protocol.js';

export interface HookRef {
  skill: string;
  method: string;
}

export interface RouteStep {
  group: string;
  stream: string;
  hop_id: string;
  hooks: HookRef[];
  timeout: number;
}

export interface HopEvent {
  v: number;
  kind: 'hop';
  hop_id: string;
  completion_id: string;
  lifecycle: string;
  stage_key: string;
  hooks: HookRef[];
  data?: Record<string, unknown> | null;
  tool?: { name: string; arguments: Record<string, unknown> } | null;
  ctx: Record<string, unknown>;
  reply_to: string;
  deadline: number;
  epoch: number;
  trace?: Record<string, unknown> | null;
  chunks: number;
  route?: RouteStep[] | null;
  /** A batched on_chunk hop of protocol 1.1: the stream its chunks come from (../wire/chunkBatch.ts). */
  text?: ChunkText | null;
}

export interface HookTiming {
  hook: string;
  duration_ms: number;
  outcome: string;
  error?: string;
}

export interface HopReply {
  v: number;
  kind: 'reply';
  hop_id: string;
  completion_id: string;
  replica: string;
  data?: Record<string, unknown>;
  tool_result?: string;
  state: Record<string, unknown>;
  session: Record<string, unknown>;
  abort?: Record<string, unknown>;
  blocked: boolean;
  outcomes: HookTiming[];
  failure?: string;
  duration_ms: number;
  processed: number;
  forwarded?: string;
  /** A 1.1 batch whose stream's text this replica lacks: no hook ran, the orchestrator sends it again with the text. */
  needs_text?: boolean;
}

/** An entry that is not a valid hop; `message` says why (it goes to the dead-letter stream). */
export class DecodeError extends Error {}

export type Fields = Record<string, string>;

export const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
export const isString = (v: unknown): boolean => typeof v === 'string';
export const isNumber = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v);
export const isInteger = (v: unknown): boolean => Number.isInteger(v);

/** The envelope of an entry (its `e` field) as checked field by field, with the messages
 * the Python model's validation gives, for the dead-letter stream's reason. */
export class EnvelopeCheck {
  readonly value: Record<string, unknown>;
  private readonly problems: string[] = [];

  constructor(fields: Fields, readonly model: string) {
    const raw = fields.e;
    if (raw === undefined) {
      throw new DecodeError(`entry has no 'e' field (fields: ${Object.keys(fields).sort().join(', ')})`);
    }
    let value: unknown;
    try {
      value = JSON.parse(raw);
    } catch (exc) {
      throw new DecodeError(`not a valid ${model}: (root): Invalid JSON: ${(exc as Error).message}`);
    }
    if (!isObject(value)) throw new DecodeError(`not a valid ${model}: (root): Input should be an object`);
    this.value = value;
  }

  need(name: string, ok: (v: unknown) => boolean, what: string, optional = false): this {
    const v = this.value[name];
    if (v === undefined || (optional && v === null)) {
      if (!optional) this.problems.push(`${name}: Field required`);
    } else if (!ok(v)) {
      this.problems.push(`${name}: Input should be ${what}`);
    }
    return this;
  }

  /** The envelope, once every check passed; `versions`: the envelope versions this build reads. */
  valid<T>(versions: readonly number[]): T {
    if (this.problems.length) throw new DecodeError(`not a valid ${this.model}: ${this.problems.slice(0, 5).join('; ')}`);
    const v = (this.value.v ??= VERSION);
    if (!versions.includes(v as number)) {
      throw new DecodeError(`unknown envelope version ${String(v)} (this build reads ${versions.join(', ')})`);
    }
    return this.value as T;
  }
}

/** The hop in an entry, checked as strictly as the Python model checks it. */
export function decodeHop(fields: Fields): HopEvent {
  const isHookRef = (h: unknown): boolean => isObject(h) && isString(h.skill) && isString(h.method);
  const check = new EnvelopeCheck(fields, 'HopEvent')
    .need('kind', (v) => v === 'hop', "'hop'", true)
    .need('v', isInteger, 'a valid integer', true);
  for (const name of ['hop_id', 'completion_id', 'lifecycle', 'stage_key', 'reply_to']) check.need(name, isString, 'a valid string');
  check
    .need('ctx', isObject, 'a valid dictionary')
    .need('deadline', isNumber, 'a valid number')
    .need('epoch', isInteger, 'a valid integer', true)
    .need('chunks', (v) => isInteger(v) && (v as number) >= 0, 'a non-negative integer', true)
    .need('hooks', (v) => Array.isArray(v) && v.every(isHookRef), 'a list of {skill, method}', true)
    .need('data', isObject, 'a valid dictionary', true)
    .need('tool', (v) => isObject(v) && isString(v.name) && isObject(v.arguments), 'a tool invocation {name, arguments}', true)
    .need('route', (v) => Array.isArray(v) && v.every(isObject), 'a list of route steps', true)
    .need('text', isChunkText, 'a stream reference {stream, start, gap_from, gap}', true);
  const hop = check.valid<HopEvent>([VERSION, SPLIT_VERSION]);
  hop.kind = 'hop';
  hop.hooks = hop.hooks ?? [];
  hop.epoch = hop.epoch ?? 0;
  hop.chunks = hop.chunks ?? 0;
  return hop;
}

function isChunkText(v: unknown): boolean {
  if (!isObject(v) || !isString(v.stream) || !isInteger(v.start)) return false;
  const gap = v.gap;
  return (gap === undefined || gap === null || (Array.isArray(gap) && gap.every(isString)))
    && (v.gap_from === undefined || v.gap_from === null || isInteger(v.gap_from));
}

/** (Context JSON, HookData JSON or undefined) of a version 2 hop; undefined for version 1. */
export function hopParts(hop: HopEvent, fields: Fields): [string, string | undefined] | undefined {
  if (hop.v !== SPLIT_VERSION) return undefined;
  const ctx = fields.c;
  if (ctx === undefined) throw new DecodeError(`version ${SPLIT_VERSION} hop without a 'c' field`);
  return [ctx, fields.d];
}

/** JSON without the null and undefined fields (pydantic's `exclude_none`), top level only
 * as far as the envelope's own optional fields go. */
function withoutNone(value: object): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) if (v !== null && v !== undefined) out[k] = v;
  return out;
}

/** A reply entry as flat [field, value, ...]: `e`, then `d` when it carries changed data. */
export function encodeReply(reply: HopReply, dataJson?: string): string[] {
  const fields = ['e', JSON.stringify(withoutNone(reply))];
  if (dataJson !== undefined) fields.push('d', dataJson);
  return fields;
}

/** A version 2 hop entry (a stage sent on to the next group): `e`, `c`, `d`. */
export function encodeHop(hop: HopEvent, dataJson: string, ctxJson: string): string[] {
  const envelope = withoutNone({ ...hop, v: SPLIT_VERSION, data: null, ctx: {} });
  return ['e', JSON.stringify(envelope), 'c', ctxJson, 'd', dataJson];
}

/** A failure reply: the hop as a whole could not be run (dead-lettered, not encodable...). */
export function failureReply(hop: Pick<HopEvent, 'hop_id' | 'completion_id'>, replica: string, failure: string, v = VERSION): HopReply {
  return {
    v, kind: 'reply', hop_id: hop.hop_id, completion_id: hop.completion_id, replica,
    state: {}, session: {}, blocked: false, outcomes: [], failure, duration_ms: 0, processed: 0,
  };
}

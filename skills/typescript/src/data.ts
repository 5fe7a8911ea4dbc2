/**
 * HookData: what one lifecycle point hands to its hooks, as the JSON the orchestrator
 * sends (the Python model hookbus.skills.data.HookData, field for field).
 *
 * A hook gets it wrapped so that assigning a field that is read-only at this lifecycle
 * point throws a TypeError naming the writable ones, as the Python SDK raises an
 * AttributeError: a mistake shows at once instead of being silently dropped.
 */

import { WRITABLE, isLifecycle } from './lifecycle.js';
import type { HookErrorDict } from './errors.js';

export interface ToolCall {
  id?: string;
  type?: string;
  function: { name: string; arguments: string };
  [key: string]: unknown;
}

export interface Message {
  role: string;
  content?: unknown;
  [key: string]: unknown;
}

/** An OpenAI `ChatCompletionChunk` (only what hooks usually touch is typed). */
export interface ChatCompletionChunk {
  id: string;
  choices: Array<{ index: number; delta: { role?: string; content?: string | null; [key: string]: unknown }; finish_reason?: string | null; [key: string]: unknown }>;
  [key: string]: unknown;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  [key: string]: unknown;
}

/** The stage's data; which fields are meaningful and writable depends on `lifecycle`. */
export interface HookData {
  readonly lifecycle: string;
  messages?: Message[] | null;
  stream?: boolean | null;
  tools?: Array<Record<string, unknown>> | null;
  model_settings?: Record<string, unknown> | null;
  iteration?: number | null;
  response?: Record<string, unknown> | null;
  usage?: Usage | null;
  // `any`: the page's hooks write `data.chunk.choices[0].delta.content = ...` without a check
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  chunk?: any;
  content?: string | null;
  chunk_index?: number | null;
  full_content?: string | null;
  /** on_chunk with a hold-back window (`holdBack`): the text that passed the hooks before
   * this chunk and the client has not received yet; a hook may rewrite it. */
  held?: string | null;
  tool_call?: ToolCall | null;
  tool_id?: string | null;
  tool_skipped?: boolean;
  client_tool?: boolean;
  tool_result?: string | null;
  /** finalize_connection: the error that ended the run (its wire form), else null. */
  error?: HookErrorDict | null;
  /** on_compaction: what the compaction did. */
  compaction?: Compaction | null;
  /** on_compaction: true when no request is running (ctx then holds no request's auth, session or state). */
  between_turns?: boolean | null;
}

/** A compaction outcome (hookbus's `Compaction`, as JSON). */
export interface Compaction {
  stage: 'none' | 'cleared' | 'summarized' | 'dropped';
  messages: Array<Record<string, unknown>>;
  before: number;
  after: number;
  window: number;
  summary?: string | null;
  [key: string]: unknown;
}

/** Every field of the Python model, in its order: what a reply may carry (the model forbids others). */
export const FIELDS: readonly string[] = [
  'lifecycle', 'messages', 'stream', 'tools', 'model_settings', 'iteration', 'response', 'usage',
  'chunk', 'content', 'chunk_index', 'full_content', 'held', 'tool_call', 'tool_id', 'tool_skipped',
  'client_tool', 'tool_result', 'error', 'compaction', 'between_turns',
];
const KNOWN = new Set(FIELDS);

const targets = new WeakMap<object, Record<string, unknown>>();

/** `raw` behind a guard that refuses writes to fields read-only at its lifecycle. */
export function guarded(raw: Record<string, unknown>): HookData {
  const lifecycle = raw.lifecycle;
  const writable = isLifecycle(lifecycle) ? WRITABLE[lifecycle] : undefined;
  const proxy = new Proxy(raw, {
    set(target, name, value) {
      refuse(name, lifecycle, writable);
      target[name as string] = value;
      return true;
    },
    deleteProperty(target, name) {
      refuse(name, lifecycle, writable);
      delete target[name as string];
      return true;
    },
  });
  targets.set(proxy, raw);
  return proxy as unknown as HookData;
}

function refuse(name: string | symbol, lifecycle: unknown, writable: ReadonlySet<string> | undefined): void {
  if (typeof name !== 'string') return;
  if (!KNOWN.has(name)) {
    throw new TypeError(`HookData has no field ${name}; its fields are: ${FIELDS.join(', ')}`);
  }
  if (writable !== undefined && !writable.has(name)) {
    const allowed = [...writable].sort().join(', ') || 'nothing';
    throw new TypeError(`HookData.${name} is read-only at ${String(lifecycle)}; a hook may change: ${allowed}`);
  }
}

/** The plain object behind a guarded HookData (or the object itself). */
export function unguarded(data: object): Record<string, unknown> {
  return targets.get(data) ?? (data as Record<string, unknown>);
}

/** HookData as the JSON the Python model validates: its own fields only, in its order. */
export function dumpData(raw: Record<string, unknown>): string {
  const out: Record<string, unknown> = {};
  for (const name of FIELDS) {
    if (raw[name] !== undefined) out[name] = raw[name];
  }
  return JSON.stringify(out);
}

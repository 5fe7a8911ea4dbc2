/**
 * A batched on_chunk hop (hookbus.bus.chunk_batch): `d` is a JSON array of on_chunk
 * HookData without their default fields. Protocol 1.0 (no `text` on the hop):
 * `full_content` only on the first one (each next one's is the previous one's plus its
 * own `content`: rebuilt here). Protocol 1.1 (the hop's `text` names its stream,
 * hookbus.bus.wire.stream_text): no `full_content` at all, and no `content` where it is
 * the chunk's own text; this replica keeps each stream's text (`KeptTexts`) and sets every
 * chunk's `full_content` from it. The reply's `d`, when any chunk changed, is an array
 * with one item per processed chunk: its HookData (1.1: without `full_content`, and
 * without a `content` that is the chunk's own text), or null for a chunk the hooks left
 * unchanged.
 *
 * With a hold-back window the first chunk carries `held`, the text the orchestrator holds
 * back from the client (hookbus.services.orchestrator.streaming.hold_back); `HeldText` follows it
 * through the batch.
 */

import { dumpData } from '../data.js';

/** The chunks of a batch; `rebuild` (protocol 1.0): every `full_content` rebuilt. */
export function loadChunks(raw: string, rebuild = true): Array<Record<string, unknown>> {
  const chunks: unknown = JSON.parse(raw);
  if (!Array.isArray(chunks) || chunks.length === 0) {
    throw new Error('a batched on_chunk hop without chunks');
  }
  let full = '';
  chunks.forEach((chunk, index) => {
    if (typeof chunk !== 'object' || chunk === null || Array.isArray(chunk)) {
      throw new Error(`chunk ${index} of the batch is not an object`);
    }
    const data = chunk as Record<string, unknown>;
    data.lifecycle ??= 'on_chunk';
    if (!rebuild) return;
    if (index === 0) {
      full = typeof data.full_content === 'string' ? data.full_content : '';
    } else {
      full += typeof data.content === 'string' ? data.content : '';
      data.full_content = full;
    }
  });
  return chunks as Array<Record<string, unknown>>;
}

/** This chunk's text ("" for role-only, tool-call, finish and usage chunks). */
export function chunkText(chunk: unknown): string {
  const choices = (chunk as { choices?: Array<{ delta?: { content?: unknown } }> } | null | undefined)?.choices;
  const content = choices?.[0]?.delta?.content;
  return typeof content === 'string' ? content : '';
}

/** The chunks of a protocol 1.1 batch, each `content` put back (its chunk's text where left out). */
export function loadKeptChunks(raw: string): Array<Record<string, unknown>> {
  const chunks = loadChunks(raw, false);
  for (const chunk of chunks) if (typeof chunk.content !== 'string') chunk.content = chunkText(chunk.chunk);
  return chunks;
}

/** A protocol 1.1 chunk's HookData as the orchestrator writes it and a result carries it:
 * never its `full_content`, nor a `content` that is its chunk's text. */
export function dumpKept(data: Record<string, unknown>): string {
  const { full_content: _full, ...rest } = data;
  if (rest.content === chunkText(rest.chunk)) delete rest.content;
  return dumpData(rest);
}

/** Which stream a 1.1 batch's chunks come from, and the text its replica may lack (hookbus.bus.wire.stream_text.ChunkText). */
export interface ChunkText {
  stream: string;
  start: number;
  gap_from?: number | null;
  gap?: string[] | null;
}

interface Kept {
  text: string;
  nextIndex: number;
  used: number;
}

/** Characters of stream text one replica keeps at most (the least recently used stream is forgotten first). */
export const MAX_KEPT_CHARS = 64 * 1024 * 1024;
/** Seconds after its last hop that a stream's text is forgotten. */
export const KEPT_IDLE = 300;

/**
 * A replica's texts of the streams its hops came from (hookbus.bus.wire.stream_text.KeptTexts).
 * `take` hands out the text before a batch's first chunk (out of the store while the batch
 * runs), or undefined when this replica lacks it (the reply then asks: `needs_text`);
 * `keep` stores it again, through the batch.
 */
export class KeptTexts {
  private readonly streams = new Map<string, Kept>();
  private chars = 0;

  constructor(private readonly maxChars = MAX_KEPT_CHARS, private readonly idle = KEPT_IDLE) {}

  take(ref: ChunkText, firstIndex: number): string | undefined {
    const kept = this.streams.get(ref.stream);
    if (kept !== undefined) {
      this.streams.delete(ref.stream);
      this.chars -= kept.text.length;
    }
    if (firstIndex === ref.start) return '';
    if (kept !== undefined && kept.nextIndex === firstIndex) return kept.text;
    const gap = ref.gap;
    const from = ref.gap_from;
    if (!Array.isArray(gap) || typeof from !== 'number') return undefined;
    if (from === ref.start) return gap.join('');
    if (kept !== undefined && from <= kept.nextIndex && kept.nextIndex <= firstIndex) {
      return kept.text + gap.slice(kept.nextIndex - from).join('');
    }
    return undefined;
  }

  keep(ref: ChunkText, text: string, nextIndex: number): void {
    const now = performance.now() / 1000;
    this.streams.set(ref.stream, { text, nextIndex, used: now });
    this.chars += text.length;
    for (const [stream, oldest] of this.streams) {
      if (this.chars <= this.maxChars && oldest.used >= now - this.idle) break;
      this.streams.delete(stream);
      this.chars -= oldest.text.length;
    }
  }

  get size(): number {
    return this.streams.size;
  }
}

export function dumpResults(results: ReadonlyArray<string | null>): string {
  return `[${results.map((r) => r ?? 'null').join(',')}]`;
}

/**
 * The held text through one batch (hookbus.bus.wire.chunk_batch.HeldText): the first chunk
 * brings what the orchestrator holds; each later chunk's hooks see that, as the earlier
 * chunks' hooks left it, followed by those chunks' text (the orchestrator releases nothing
 * of a batch before its reply, so that is what it holds when it applies a rewrite). A later
 * chunk's `held` goes back only when its hooks changed it, so an unchanged chunk still
 * dumps as it came. Inactive when the batch has no window (no `held` on its first chunk).
 */
export class HeldText {
  private text: string | null = null;
  private first = true;

  /** Before the chunk's hooks run (after its dump for the change check). */
  give(chunk: Record<string, unknown>): void {
    if (this.first) this.text = typeof chunk.held === 'string' ? chunk.held : null;
    else if (this.text !== null) chunk.held = this.text;
  }

  /** After the chunk's hooks ran (before its dump for the change check). */
  took(data: Record<string, unknown>): void {
    const first = this.first;
    this.first = false;
    if (this.text === null) return;
    const held = typeof data.held === 'string' ? data.held : this.text;
    if (!first && held === this.text) delete data.held;
    const chunk = data.chunk as { choices?: unknown[] } | null | undefined;
    const shown = Boolean(chunk?.choices?.length);
    this.text = held + (shown && typeof data.content === 'string' ? data.content : '');
  }
}

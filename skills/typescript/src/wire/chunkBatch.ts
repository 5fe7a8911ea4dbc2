/**
 * A batched on_chunk hop (hookbus.bus.chunk_batch): `d` is a JSON array of on_chunk
 * HookData without their default fields, `full_content` only on the first one (each
 * next one's is the previous one's plus its own `content`: rebuilt here). The reply's `d`,
 * when any chunk changed, is an array with one item per processed chunk: its HookData,
 * or null for a chunk the hooks left unchanged.
 *
 * With a hold-back window the first chunk carries `held`, the text the orchestrator holds
 * back from the client (hookbus.services.orchestrator.hold_back); `HeldText` follows it
 * through the batch.
 */

export function loadChunks(raw: string): Array<Record<string, unknown>> {
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
    if (index === 0) {
      full = typeof data.full_content === 'string' ? data.full_content : '';
    } else {
      full += typeof data.content === 'string' ? data.content : '';
      data.full_content = full;
    }
  });
  return chunks as Array<Record<string, unknown>>;
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

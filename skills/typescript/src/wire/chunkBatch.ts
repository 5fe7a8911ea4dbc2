/**
 * A batched on_chunk hop (hookbus.bus.chunk_batch): `d` is a JSON array of on_chunk
 * HookData without their default fields, `full_content` only on the first one (each
 * next one's is the previous one's plus its own `content`: rebuilt here). The reply's `d`,
 * when any chunk changed, is an array with one item per processed chunk: its HookData,
 * or null for a chunk the hooks left unchanged.
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

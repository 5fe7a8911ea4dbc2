/**
 * The lifecycle points of one agent request, and `on_compaction` (whenever a compaction
 * changed the conversation, inside a request or between turns), and what a hook may
 * change at each.
 * The same table as the Python SDK (hookbus.skills.lifecycle): a TypeScript hook that
 * assigns a read-only field fails the same way a Python one does.
 */

export const LIFECYCLES = [
  'on_connection',
  'before_llm_call',
  'after_llm_call',
  'on_chunk',
  'before_toolcall',
  'after_toolcall',
  'on_message',
  'finalize_connection',
  'on_compaction',
] as const;

export type Lifecycle = (typeof LIFECYCLES)[number];

/** Fields a hook may assign at each lifecycle point; everything else is read-only there. */
export const WRITABLE: Readonly<Record<Lifecycle, ReadonlySet<string>>> = {
  on_connection: new Set(['messages', 'stream']),
  before_llm_call: new Set(['messages', 'tools', 'model_settings']),
  after_llm_call: new Set(['response', 'usage']),
  on_chunk: new Set(['chunk', 'content', 'held']),
  before_toolcall: new Set(['tool_call', 'tool_skipped', 'tool_result']),
  after_toolcall: new Set(['tool_result']),
  on_message: new Set(['messages']),
  finalize_connection: new Set(),
  on_compaction: new Set(),
};

/** Points that tell hooks of what happened rather than let them steer it: every hook runs,
 * a HookError is logged, and no failure aborts or blocks anything. */
export const NOTIFICATIONS: ReadonlySet<string> = new Set(['finalize_connection', 'on_compaction']);

export function isLifecycle(name: unknown): name is Lifecycle {
  return typeof name === 'string' && (LIFECYCLES as readonly string[]).includes(name);
}

/** `name` if it is a lifecycle point; otherwise an error listing the valid names. */
export function checkLifecycle(name: unknown): Lifecycle {
  if (!isLifecycle(name)) {
    throw new TypeError(`unknown lifecycle ${JSON.stringify(name)}; valid lifecycles are: ${LIFECYCLES.join(', ')}`);
  }
  return name;
}

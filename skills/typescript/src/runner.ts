/**
 * Runs an ordered list of hooks over one stage's data with hookbus's failure rules, the
 * same rules as the Python runner (hookbus.skills.runner), so a hook behaves the same
 * whichever language's worker group runs it:
 *
 * - a HookError aborts the run (except at a notification point, finalize_connection and
 *   on_compaction, where every hook runs);
 * - a failure (a plain exception, a timeout, a return value that is not HookData)
 *   refuses the request with 503 guard_unavailable for a guard, aborts it as a 500 for a
 *   critical hook, blocks the tool call in before_toolcall, and elsewhere leaves the data
 *   unchanged and lets the chain go on;
 * - on every failure path the hook's changes to the data and to ctx.state are undone.
 *
 * A timed-out hook cannot be stopped in JavaScript: its promise is abandoned (what it does
 * later to the data or state is no longer seen by anyone, as they are restored).
 */

import { GuardUnavailable, HookError, isHookError, type HookErrorDict } from './errors.js';
import { guarded, unguarded } from './data.js';
import type { Context } from './context.js';
import type { BoundHook } from './skill.js';
import type { HookDescriptor } from './descriptors.js';
import { log } from './log.js';
import { NOTIFICATIONS } from './lifecycle.js';

/** Wraps each hook call (a tracing span: ./worker/tracing.ts), ended with the failure if it failed. */
export type HookObserver = (key: string, lifecycle: string) => { end(error?: string): void };

export type Outcome = 'ok' | 'failed' | 'hop_failed' | 'timeout' | 'blocked' | 'aborted' | 'skipped' | 'expired' | 'dead_letter';

export interface HookOutcome {
  hook: string;
  duration_ms: number;
  outcome: Outcome;
  error?: string;
}

export interface ChainResult {
  data: Record<string, unknown>;
  outcomes: HookOutcome[];
  abort: HookErrorDict | null;
  blocked: boolean;
}

/** Whether a stage's next segment runs after one that ended so (the orchestrator's rule). */
export function stageGoesOn(lifecycle: string, aborted: boolean, blocked: boolean): boolean {
  return !blocked && (!aborted || NOTIFICATIONS.has(lifecycle));
}

class TimeoutError extends Error {
  override name = 'TimeoutError';
}

class WrongReturn extends Error {}

export async function runHooks(
  hooks: readonly BoundHook[],
  data: Record<string, unknown>,
  ctx: Context,
  stageKey = '',
  attempt = 1,
  observe?: HookObserver,
): Promise<ChainResult> {
  const result: ChainResult = { data, outcomes: [], abort: null, blocked: false };
  const lifecycle = String(data.lifecycle);
  for (const bound of hooks) {
    ctx.call.idempotency_key = `${ctx.metadata.completion_id}:${stageKey || lifecycle}:${bound.key}`;
    ctx.call.attempt = attempt;
    const savedFields = snapshot(result.data);
    const savedState = copyState(ctx.state);
    const chunkBefore = lifecycle === 'on_chunk' ? { content: result.data.content, text: chunkText(result.data) } : undefined;
    const started = performance.now();
    let returned: unknown;
    const observed = observe?.(bound.key, lifecycle);
    try {
      returned = await call(bound.fn, [guarded(result.data), ctx], bound.descriptor.timeout);
      if (returned !== undefined && returned !== null && (typeof returned !== 'object' || Array.isArray(returned))) {
        throw new WrongReturn(`returned ${Array.isArray(returned) ? 'array' : typeof returned}, expected HookData or undefined`);
      }
      observed?.end();
    } catch (exc) {
      observed?.end(describe(exc, bound.descriptor.timeout));
      restore(result.data, savedFields, ctx, savedState);
      if (isHookError(exc)) {
        result.outcomes.push(outcome(bound.key, started, 'aborted', exc.message));
        if (NOTIFICATIONS.has(lifecycle)) {
          log('notification_hook_error', { hook: bound.key, lifecycle, error: exc.message, completion_id: ctx.completion_id }, 'warning', 'hookbus.hooks');
          continue;
        }
        result.abort = exc.toDict();
        return result;
      }
      const message = describe(exc, bound.descriptor.timeout);
      log('hook_failed', { hook: bound.key, lifecycle, error: message, completion_id: ctx.completion_id }, 'warning', 'hookbus.hooks');
      const effect = fail(result, bound.descriptor, bound.key, message);
      if (effect === 'unchanged') {
        result.outcomes.push(outcome(bound.key, started, exc instanceof TimeoutError ? 'timeout' : 'failed', message));
        continue;
      }
      result.outcomes.push(outcome(bound.key, started, result.abort ? 'aborted' : 'blocked', message));
      return result;
    }
    if (returned !== undefined && returned !== null) {
      const next = unguarded(returned as object);
      if (next !== result.data) {
        // another HookData object: it replaces the data (its lifecycle cannot change)
        result.data = { ...next, lifecycle: result.data.lifecycle };
      }
    }
    if (chunkBefore) chunkTextAgrees(result.data, chunkBefore.content, chunkBefore.text);
    result.outcomes.push(outcome(bound.key, started, 'ok'));
  }
  return result;
}

interface Delta {
  content?: string | null;
}

function firstDelta(data: Record<string, unknown>): Delta | undefined {
  const chunk = data.chunk as { choices?: Array<{ delta?: Delta }> } | null | undefined;
  return chunk?.choices?.[0]?.delta ?? undefined;
}

/** The text of an on_chunk stage's chunk (its first choice's delta), null without one. */
function chunkText(data: Record<string, unknown>): string | null {
  return firstDelta(data)?.content ?? null;
}

/** After an on_chunk hook, `content` and the chunk's text say the same for the next hook
 * (the Python runner's rule): a hook that changed `content` changed the chunk's text, a hook
 * that changed only the chunk's text changed `content`; `full_content` stays the model's. */
function chunkTextAgrees(data: Record<string, unknown>, content: unknown, text: string | null): void {
  const delta = firstDelta(data);
  if (!delta) return;
  if ((data.content ?? null) !== (content ?? null)) delta.content = (data.content as string | null | undefined) ?? null;
  else if ((delta.content ?? null) !== text) data.content = delta.content ?? null;
}

type Effect = 'refuse' | 'abort' | 'block' | 'unchanged';

function failureEffect(d: HookDescriptor): Effect {
  if (NOTIFICATIONS.has(d.lifecycle)) return 'unchanged';
  if (d.guard) return 'refuse';
  if (d.critical) return 'abort';
  if (d.lifecycle === 'before_toolcall') return 'block';
  return 'unchanged';
}

function fail(result: ChainResult, descriptor: HookDescriptor, key: string, reason: string): Effect {
  const effect = failureEffect(descriptor);
  if (effect === 'refuse') {
    result.abort = new GuardUnavailable(key, reason).toDict();
  } else if (effect === 'abort') {
    result.abort = new HookError(500, 'hook_failed', `critical hook ${key} failed: ${reason}`).toDict();
  } else if (effect === 'block') {
    // the model then sees tool_result as the tool's answer
    result.data.tool_skipped = true;
    result.data.tool_result = `Tool call blocked by ${key}: ${reason}`;
    result.blocked = true;
  }
  return effect;
}

/** Run `fn(...args)`, bounded by `timeout` seconds when given. */
export async function call(fn: (...args: never[]) => unknown, args: unknown[], timeout: number | null): Promise<unknown> {
  const running = Promise.resolve().then(() => (fn as (...a: unknown[]) => unknown)(...args));
  if (timeout === null) return running;
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new TimeoutError(`timed out after ${seconds(timeout)}s`)), timeout * 1000);
  });
  running.catch(() => undefined); // an abandoned hook's late failure is nobody's business
  try {
    return await Promise.race([running, expired]);
  } finally {
    clearTimeout(timer);
  }
}

/** The fields, and copies of the messages and tools lists and their items: what the
 * Python runner saves (a deep copy per hook call would cost more than it saves). */
function snapshot(data: Record<string, unknown>): Record<string, unknown> {
  const saved = { ...data };
  for (const name of ['messages', 'tools']) {
    const list = saved[name];
    if (Array.isArray(list)) saved[name] = list.map((item) => (item && typeof item === 'object' ? { ...item } : item));
  }
  return saved;
}

function restore(data: Record<string, unknown>, saved: Record<string, unknown>, ctx: Context, state: Record<string, unknown>): void {
  for (const name of Object.keys(data)) if (!(name in saved)) delete data[name];
  Object.assign(data, saved);
  for (const name of Object.keys(ctx.state)) delete ctx.state[name];
  Object.assign(ctx.state, state);
}

/** A deep copy of ctx.state (it is JSON: it travels with the request); shallow for what cannot be cloned. */
export function copyState(state: Record<string, unknown>): Record<string, unknown> {
  try {
    return structuredClone(state);
  } catch {
    return { ...state };
  }
}

/** Python's `f"{type(exc).__name__}: {exc}"`, so the orchestrator logs read alike. */
function describe(exc: unknown, timeout: number | null): string {
  if (exc instanceof TimeoutError) return `timed out after ${seconds(timeout ?? 0)}s`;
  if (exc instanceof WrongReturn) return exc.message;
  if (exc instanceof Error) return `${exc.name}: ${exc.message}`;
  return `Error: ${String(exc)}`;
}

/** Seconds as Python prints a float (2 -> "2.0"). */
function seconds(value: number): string {
  return Number.isInteger(value) ? value.toFixed(1) : String(value);
}

function outcome(hook: string, started: number, kind: Outcome, error?: string): HookOutcome {
  const o: HookOutcome = { hook, duration_ms: performance.now() - started, outcome: kind };
  if (error !== undefined) o.error = error;
  return o;
}

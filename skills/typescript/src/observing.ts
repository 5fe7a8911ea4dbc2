/**
 * How observers (`@hook({ ..., observe: true })`) are called (hookbus.skills.observing):
 * after their stage, off the request's path, with the stage's data as the stage ended.
 * Around each call:
 *
 * - `ctx.state` is the request's state as the stage ended, plus what the request's
 *   observers (of this group) wrote to it at earlier stages of the same request (top-level
 *   keys; theirs win): an observer that stamps a start time at on_connection finds it at
 *   finalize_connection. What observers write never reaches the request's own hooks.
 * - `ctx.call.stage_started` / `ctx.call.stage_ended` say when the stage ran (an observer
 *   runs later, so `Date.now()` is not the stage's time).
 * - What it returns is ignored; what it throws (a HookError too) is logged and recorded as
 *   its outcome, and the next observer still runs. Each observer goes through the runner
 *   alone, so timeouts and the undoing of a failed call's state are those of any hook.
 */

import type { Context } from './context.js';
import { copyState, runHooks, type HookOutcome } from './runner.js';
import type { BoundHook } from './skill.js';
import type { StageSeen } from './wire/observations.js';
import { log } from './log.js';

/** What one request's observers wrote to `ctx.state`, carried from stage to stage. */
export class ObserverMemory {
  private readonly written: Record<string, unknown> = {};

  /** The state an observer sees: the request's, with the observers' own on top. */
  stateFor(requestState: Record<string, unknown>): Record<string, unknown> {
    return { ...copyState(requestState), ...copyState(this.written) };
  }

  /** Remember the top-level keys the observers set or changed in `seen`. */
  keep(requestState: Record<string, unknown>, seen: Record<string, unknown>): void {
    for (const [key, value] of Object.entries(seen)) {
      if (key in this.written || !(key in requestState) || !sameJson(requestState[key], value)) this.written[key] = value;
    }
  }
}

function sameJson(a: unknown, b: unknown): boolean {
  try {
    return JSON.stringify(a) === JSON.stringify(b);
  } catch {
    return a === b;
  }
}

/** Call each observer of one stage in order; `ctx` is the request's context for observers
 * (its `state` and `call` are set here). Never throws for an observer's failure. */
export async function observeStage(
  hooks: readonly BoundHook[], stage: StageSeen, ctx: Context, memory: ObserverMemory, attempt = 1,
): Promise<HookOutcome[]> {
  ctx.state = memory.stateFor(stage.state);
  ctx.call.stage_started = stage.started;
  ctx.call.stage_ended = stage.ended;
  const outcomes: HookOutcome[] = [];
  for (const bound of hooks) {
    const result = await runHooks([bound], stage.data, ctx, stage.stageKey, attempt);
    if (result.abort && stage.data.lifecycle !== 'finalize_connection') {
      log('observer_raised', {
        hook: bound.key, lifecycle: stage.data.lifecycle, error: result.abort.message, completion_id: ctx.completion_id,
        hint: 'an observer cannot abort the request; declare it without observe: true to stop requests',
      }, 'warning', 'hookbus.observers');
    }
    outcomes.push(...result.outcomes);
  }
  memory.keep(stage.state, ctx.state);
  return outcomes;
}

/**
 * `Skill`: a named bundle of hooks and tools, as in the Python SDK. Subclass it, set
 * `readonly name` (and `readonly version`, if the skill has one), decorate methods with
 * `@hook` / `@tool`, optionally define `onCompaction(outcome, ctx)`.
 *
 * `onCompaction` (or the Python spelling `on_compaction`) without `@hook` is a hook on
 * `on_compaction` too, as the Python SDK's method form: announced like a decorated hook
 * (priority 50, key `<skill>.<method>`) and called with the outcome, and with the context
 * only when a request is running (`undefined` between turns).
 *
 * A skill is stateless across requests (keep per-request state in `ctx.state`): one
 * instance serves every request its worker replica runs, and one request's hooks may
 * run on different replicas.
 */

import { DEFAULT_PRIORITY, HOOK_MARK, TOOL_MARK, type HookMark, type ToolMark } from './decorators.js';
import type { HookDescriptor, ToolDescriptor } from './descriptors.js';
import type { Compaction } from './data.js';

export type { Compaction } from './data.js';

/** The hooks a skill may define by name alone: `onCompaction(outcome, ctx)`. */
const METHOD_FORMS: ReadonlySet<string> = new Set(['onCompaction', 'on_compaction']);
const METHOD_FORM_MARK: HookMark = {
  lifecycle: 'on_compaction', priority: DEFAULT_PRIORITY, scope: 'all', timeout: null,
  critical: false, guard: false, observe: false, hold_back: 0,
};

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Fn = (...args: any[]) => any;

export interface BoundHook {
  descriptor: HookDescriptor;
  key: string;
  fn: Fn;
}

export interface BoundTool {
  descriptor: ToolDescriptor;
  fn: Fn;
}

/**
 * Optional on a subclass: `async onCompaction(outcome: Compaction, context?: Context)`,
 * called once per compaction with its outcome and the run's context (`undefined` between
 * turns). Not declared here, so that a subclass may define it as a plain method.
 */
export class Skill {
  /** The skill's name (hook keys are `name.method`); default: the class name in kebab case. */
  readonly name: string;
  /** The skill's own version: a worker group of versioned skills runs at it when the
   * deployment names none (`--version`, HOOKBUS_WORKER_VERSION). */
  readonly version: string | undefined = undefined;

  constructor() {
    this.name = kebab(new.target.name);
  }

  /** The hooks of this instance, inherited ones first, each class's in definition order. */
  boundHooks(): BoundHook[] {
    return [...marked<HookMark>(this, HOOK_MARK, METHOD_FORMS, METHOD_FORM_MARK)].map(([method, [mark, fn, named]]) => {
      const descriptor: HookDescriptor = { skill: this.name, method, ...mark };
      return { descriptor, key: `${this.name}.${method}`, fn: named ? methodForm(fn.bind(this)) : fn.bind(this) };
    });
  }

  boundTools(): BoundTool[] {
    return [...marked<ToolMark>(this, TOOL_MARK)].map(([method, [mark, fn]]) => {
      const name = mark.name ?? method;
      const descriptor: ToolDescriptor = {
        skill: this.name,
        name,
        parameters_schema: {
          type: 'function',
          function: { name, description: mark.description ?? name, parameters: mark.parameters },
        },
        scope: mark.scope,
        timeout: mark.timeout,
      };
      return { descriptor, fn: fn.bind(this) };
    });
  }

}

/** `onCompaction(outcome, ctx)` called as a hook: `(data, ctx)` in, the outcome and the
 * context (`undefined` between turns) out; what it returns is not the stage's data. */
function methodForm(onCompaction: Fn): Fn {
  return async (data: { compaction?: Compaction | null; between_turns?: boolean | null }, ctx: unknown) => {
    await onCompaction(data.compaction, data.between_turns ? undefined : ctx);
  };
}

/** Marked methods by name, and whether each is a method form (`named`: an unmarked method
 * whose name makes it a hook, with `namedMark`): walked from the base class down, so an
 * override keeps the position of the method it overrides (Python's definition order,
 * inherited first). */
function marked<M>(skill: Skill, symbol: symbol, named: ReadonlySet<string> = new Set(), namedMark?: M): Map<string, [M, Fn, boolean]> {
  const chain: object[] = [];
  for (let proto = Object.getPrototypeOf(skill); proto && proto !== Skill.prototype; proto = Object.getPrototypeOf(proto)) {
    chain.unshift(proto);
  }
  const found = new Map<string, [M, Fn, boolean]>();
  for (const proto of chain) {
    for (const name of Object.getOwnPropertyNames(proto)) {
      if (name === 'constructor') continue;
      const value = Object.getOwnPropertyDescriptor(proto, name)?.value;
      if (typeof value !== 'function') continue;
      const mark = (value as unknown as Record<symbol, M | undefined>)[symbol];
      if (mark !== undefined) found.set(name, [mark, value as Fn, false]);
      else if (namedMark !== undefined && named.has(name)) found.set(name, [namedMark, value as Fn, true]);
      else found.delete(name); // overridden without the decorator: no longer a hook
    }
  }
  return found;
}

function kebab(className: string): string {
  return className.replace(/(?<!^)(?=[A-Z])/g, '-').toLowerCase();
}

/** Whether `value` is a class deriving from Skill (also from another copy of this package). */
export function isSkillClass(value: unknown): value is new () => Skill {
  if (typeof value !== 'function' || value === Skill) return false;
  for (let proto = Object.getPrototypeOf(value); proto; proto = Object.getPrototypeOf(proto)) {
    if (proto === Skill || (typeof proto === 'function' && proto.name === 'Skill' && 'boundHooks' in proto.prototype)) {
      return true;
    }
  }
  return false;
}

/**
 * `Skill`: a named bundle of hooks and tools, as in the Python SDK. Subclass it, set
 * `readonly name`, decorate methods with `@hook` / `@tool`, optionally define
 * `onCompaction(outcome, ctx)`.
 *
 * A skill is stateless across requests (keep per-request state in `ctx.state`): one
 * instance serves every request its worker replica runs, and one request's hooks may
 * run on different replicas.
 */

import { HOOK_MARK, TOOL_MARK, type HookMark, type ToolMark } from './decorators.js';
import type { HookDescriptor, ToolDescriptor } from './descriptors.js';

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

/**
 * Optional on a subclass: `async onCompaction(outcome: Compaction, context?: Context)`,
 * called once per compaction with its outcome and the run's context (`undefined` between
 * turns). Not declared here, so that a subclass may define it as a plain method.
 */
export class Skill {
  /** The skill's name (hook keys are `name.method`); default: the class name in kebab case. */
  readonly name: string;

  constructor() {
    this.name = kebab(new.target.name);
  }

  /** The hooks of this instance, inherited ones first, each class's in definition order. */
  boundHooks(): BoundHook[] {
    return [...marked<HookMark>(this, HOOK_MARK)].map(([method, [mark, fn]]) => {
      const descriptor: HookDescriptor = { skill: this.name, method, ...mark };
      return { descriptor, key: `${this.name}.${method}`, fn: fn.bind(this) };
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

  /** Whether this skill defines `onCompaction` (or the Python spelling `on_compaction`). */
  compactionListener(): Fn | undefined {
    const self = this as unknown as Record<string, unknown>;
    const fn = self.onCompaction ?? self.on_compaction;
    return typeof fn === 'function' ? (fn as Fn).bind(this) : undefined;
  }
}

/** Marked methods by name: walked from the base class down, so an override keeps the
 * position of the method it overrides (Python's definition order, inherited first). */
function marked<M>(skill: Skill, symbol: symbol): Map<string, [M, Fn]> {
  const chain: object[] = [];
  for (let proto = Object.getPrototypeOf(skill); proto && proto !== Skill.prototype; proto = Object.getPrototypeOf(proto)) {
    chain.unshift(proto);
  }
  const found = new Map<string, [M, Fn]>();
  for (const proto of chain) {
    for (const name of Object.getOwnPropertyNames(proto)) {
      if (name === 'constructor') continue;
      const value = Object.getOwnPropertyDescriptor(proto, name)?.value;
      if (typeof value !== 'function') continue;
      const mark = (value as unknown as Record<symbol, M | undefined>)[symbol];
      if (mark !== undefined) found.set(name, [mark, value as Fn]);
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

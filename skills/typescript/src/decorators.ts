/**
 * `@hook` and `@tool`: they only mark the method (its options on the function), so the
 * class stays a plain class; `Skill` collects the marks when a worker binds an instance.
 * A mistake in the options (an unknown lifecycle) throws when the decorator is applied,
 * that is when the class is defined.
 *
 * Both decorator forms work: TypeScript 5's standard decorators (`(method, context)`,
 * what `tsx` and `tsc` emit by default) and the legacy `experimentalDecorators` form
 * (`(prototype, name, descriptor)`), for projects that still turn that flag on.
 */

import { checkLifecycle, type Lifecycle } from './lifecycle.js';

export const HOOK_MARK = Symbol.for('hookbus.hook');
export const TOOL_MARK = Symbol.for('hookbus.tool');

export interface HookOptions {
  lifecycle: Lifecycle | string;
  /** Lower runs first, across every group and language; default 50. */
  priority?: number;
  /** Other than 'all': runs only for callers holding this scope. */
  scope?: string;
  /** Seconds; exceeding it counts as the hook failing. */
  timeout?: number | null;
  /** A plain exception aborts the run as a 500 instead of being logged and skipped. */
  critical?: boolean;
  /** The request may not pass unchecked: a failure refuses it with 503 guard_unavailable. */
  guard?: boolean;
}

export interface HookMark {
  lifecycle: Lifecycle;
  priority: number;
  scope: string;
  timeout: number | null;
  critical: boolean;
  guard: boolean;
}

export interface ToolOptions {
  /** The tool's name as the model sees it (default: the method's name). */
  name?: string;
  description?: string;
  /** JSON Schema of the arguments object (TypeScript types do not exist at run time). */
  parameters?: Record<string, unknown>;
  scope?: string;
  timeout?: number | null;
}

export interface ToolMark {
  name: string | undefined;
  description: string | undefined;
  parameters: Record<string, unknown>;
  scope: string;
  timeout: number | null;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyMethod = (this: any, ...args: any[]) => any;

/** Works as a standard (TS 5) and as a legacy (experimentalDecorators) method decorator. */
export type MethodDecorator = <M extends AnyMethod>(
  target: M | object,
  context: ClassMethodDecoratorContext | string | symbol,
  descriptor?: PropertyDescriptor,
) => // eslint-disable-next-line @typescript-eslint/no-explicit-any
any;

function marking(symbol: symbol, mark: object): MethodDecorator {
  return (target, context, descriptor) => {
    if (typeof context === 'object' && context !== null) {
      if (context.kind !== 'method' || context.static) {
        throw new TypeError(`hookbus decorators go on instance methods, not on a ${context.static ? 'static ' : ''}${context.kind}`);
      }
      Object.defineProperty(target, symbol, { value: mark });
      return undefined;
    }
    const method = descriptor?.value;
    if (typeof method !== 'function') {
      throw new TypeError(`hookbus decorators go on methods; ${String(context)} is not one`);
    }
    Object.defineProperty(method, symbol, { value: mark });
    return descriptor;
  };
}

/**
 * Register a method `(data, ctx) => data` as a hook: `@hook({ lifecycle: 'on_chunk', priority: 30 })`
 * (or `@hook('on_chunk', 30)`). Returning `data`, `undefined` or `null` keeps the
 * changes made to `data` in place; returning another HookData object replaces it.
 */
export function hook(options: HookOptions | Lifecycle | string, priority?: number): MethodDecorator {
  const opts: HookOptions = typeof options === 'string' ? { lifecycle: options, priority } : options;
  const lifecycle = checkLifecycle(opts.lifecycle);
  const timeout = opts.timeout ?? null;
  if (timeout !== null && !(timeout > 0)) {
    throw new RangeError(`hook timeout must be positive, got ${timeout}`);
  }
  if (opts.guard && lifecycle === 'finalize_connection') {
    throw new TypeError('a finalize_connection hook cannot be a guard: the request is over by then');
  }
  const resolvedPriority = opts.priority ?? 50;
  if (!Number.isInteger(resolvedPriority)) {
    throw new TypeError(`hook priority must be an integer, got ${resolvedPriority}`);
  }
  const mark: HookMark = {
    lifecycle,
    priority: resolvedPriority,
    scope: opts.scope ?? 'all',
    timeout,
    critical: Boolean(opts.critical),
    guard: Boolean(opts.guard),
  };
  return marking(HOOK_MARK, mark);
}

/**
 * Make a method `(args, ctx) => result` an OpenAI function tool. The arguments' JSON
 * Schema is given in `parameters` (default: no arguments); a result that is not a string
 * is sent to the model as JSON.
 */
export function tool(options: ToolOptions = {}): MethodDecorator {
  const timeout = options.timeout ?? null;
  if (timeout !== null && !(timeout > 0)) {
    throw new RangeError(`tool timeout must be positive, got ${timeout}`);
  }
  const mark: ToolMark = {
    name: options.name,
    description: options.description,
    parameters: options.parameters ?? { type: 'object', properties: {}, additionalProperties: false },
    scope: options.scope ?? 'all',
    timeout,
  };
  return marking(TOOL_MARK, mark);
}

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

import { checkLifecycle, NOTIFICATIONS, type Lifecycle } from './lifecycle.js';

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
  /** An observer: called after the stage with its data as the stage ended, off the
   * request's path (no request waits for it); what it returns is ignored, what it throws
   * is logged and recorded. */
  observe?: boolean;
  /** on_chunk only: hold up to this many characters of the model's text back from the
   * client until this hook judged the text after them (`data.held`, rewritable). */
  holdBack?: number;
}

export interface HookMark {
  lifecycle: Lifecycle;
  priority: number;
  scope: string;
  timeout: number | null;
  critical: boolean;
  guard: boolean;
  observe: boolean;
  hold_back: number;
}

export const DEFAULT_PRIORITY = 50;

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
  if (opts.guard && NOTIFICATIONS.has(lifecycle)) {
    throw new TypeError(`a ${lifecycle} hook cannot be a guard: it has nothing to let through or refuse`);
  }
  const holdBack = opts.holdBack ?? 0;
  checkKind(lifecycle, Boolean(opts.observe), Boolean(opts.guard || opts.critical), holdBack);
  const resolvedPriority = opts.priority ?? DEFAULT_PRIORITY;
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
    observe: Boolean(opts.observe),
    hold_back: holdBack,
  };
  return marking(HOOK_MARK, mark);
}

/** An observer cannot stop anything, so it cannot be a guard or critical; a window only
 * holds streamed text back, for a hook that judges it (the Python decorator's rules). */
function checkKind(lifecycle: Lifecycle, observe: boolean, stops: boolean, holdBack: number): void {
  if (observe && stops) {
    throw new TypeError('an observer (observe: true) cannot be a guard or critical: it never stops the request');
  }
  if (!Number.isInteger(holdBack) || holdBack < 0) {
    throw new RangeError(`holdBack must be an integer >= 0 characters, got ${holdBack}`);
  }
  if (holdBack && lifecycle !== 'on_chunk') {
    throw new TypeError(`holdBack holds streamed text back: only on_chunk hooks take it, not ${lifecycle}`);
  }
  if (holdBack && observe) {
    throw new TypeError('holdBack is for a hook that judges the text before the client sees it, not an observer');
  }
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

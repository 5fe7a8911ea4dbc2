/**
 * The structured error that aborts a request, as in the Python SDK (hookbus.skills.errors).
 *
 * It travels over the bus as `{type, status_code, code, message, details}`; `type` is the
 * nearest of hookbus's own classes, so the Python orchestrator rebuilds a TypeScript
 * `PaymentRequired` as its own `PaymentRequired` (a 402 at the client).
 */

const BRAND = Symbol.for('hookbus.HookError');

export interface HookErrorDict {
  type: string;
  status_code: number;
  code: string;
  message: string;
  details: Record<string, unknown> | null;
}

/** Aborts the run: the client gets `status_code` and an OpenAI-style error body;
 * `finalize_connection` still runs, with `data.error` set to this error. */
export class HookError extends Error {
  readonly status_code: number;
  readonly code: string;
  readonly details: Record<string, unknown> | null;
  /** The wire name of this class (a skill's own subclass travels as its hookbus base). */
  protected readonly wireType: string = 'HookError';

  constructor(status_code: number, code: string, message: string, details?: Record<string, unknown> | null) {
    super(message);
    this.name = new.target.name;
    this.status_code = status_code;
    this.code = code;
    this.details = details ?? null;
    Object.defineProperty(this, BRAND, { value: true });
  }

  get statusCode(): number {
    return this.status_code;
  }

  toDict(): HookErrorDict {
    return {
      type: this.wireType,
      status_code: this.status_code,
      code: this.code,
      message: this.message,
      details: this.details,
    };
  }
}

/** HTTP 402: the caller has no credit left; throw it from a billing hook. */
export class PaymentRequired extends HookError {
  protected override readonly wireType: string = 'PaymentRequired';

  constructor(message = 'payment required', details?: Record<string, unknown> | null) {
    super(402, 'payment_required', message, details);
  }
}

/** 503: a guard hook could not give its verdict (the runner raises it, never a hook). */
export class GuardUnavailable extends HookError {
  protected override readonly wireType: string = 'GuardUnavailable';

  constructor(hookKey: string, reason: string) {
    super(503, 'guard_unavailable', `the guard ${hookKey} could not check this request: ${reason}`);
  }
}

/** Whether `value` is a HookError, also one from another copy of this package. */
export function isHookError(value: unknown): value is HookError {
  return value instanceof HookError || (typeof value === 'object' && value !== null && BRAND in value);
}

/** The error a `finalize_connection` hook finds in `data.error` (its wire form, rebuilt). */
export function hookErrorFromDict(value: Partial<HookErrorDict>): HookError {
  const status = Number(value.status_code);
  if (value.type === 'PaymentRequired' || (value.type === undefined && status === 402)) {
    const error = new PaymentRequired(String(value.message ?? ''), value.details ?? null);
    return error;
  }
  return new HookError(status, String(value.code ?? 'error'), String(value.message ?? ''), value.details ?? null);
}

/**
 * The request context a hook gets next to its data (hookbus.skills.context.Context).
 *
 * Skills are stateless across requests: `state` travels with the request to every process
 * that runs one of its hooks (Python or TypeScript), `session.data` is persisted per
 * conversation in Redis. Both go back to the orchestrator in the hop's reply.
 */

export interface AuthInfo {
  peer_user_id: string | null;
  scopes: string[];
}

export interface Metadata {
  completion_id: string;
  model: string;
  agent_name: string;
  [key: string]: unknown;
}

export interface Session {
  /** null for a request without a session. */
  id: string | null;
  data: Record<string, unknown>;
}

/** Which hook is running now: lets a hook make its side effects idempotent. */
export interface HookCall {
  /** Stable across redeliveries: completion id, stage, hook. */
  idempotency_key: string;
  /** Deliveries of this hop so far, counting from 1. */
  attempt: number;
  /** For an observer, which runs after its stage: the unix time the stage began (else null). */
  stage_started?: number | null;
  /** For an observer: the unix time the stage ended (what the next step started from). */
  stage_ended?: number | null;
}

export class Context {
  auth: AuthInfo;
  metadata: Metadata;
  session: Session;
  state: Record<string, unknown>;
  /** True when another orchestrator finalizes a request whose owner died. */
  recovery: boolean;
  call: HookCall;

  constructor(raw: Record<string, unknown> = {}) {
    const auth = (raw.auth ?? {}) as Partial<AuthInfo>;
    const session = (raw.session ?? {}) as Partial<Session>;
    const call = (raw.call ?? {}) as Partial<HookCall>;
    this.auth = { peer_user_id: auth.peer_user_id ?? null, scopes: auth.scopes ?? [] };
    this.metadata = { completion_id: '', model: '', agent_name: '', ...((raw.metadata ?? {}) as object) };
    this.session = { id: session.id ?? null, data: session.data ?? {} };
    this.state = (raw.state ?? {}) as Record<string, unknown>;
    this.recovery = Boolean(raw.recovery);
    this.call = {
      idempotency_key: call.idempotency_key ?? '', attempt: call.attempt ?? 1,
      stage_started: call.stage_started ?? null, stage_ended: call.stage_ended ?? null,
    };
  }

  get completion_id(): string {
    return this.metadata.completion_id;
  }

  /** Whether a hook or tool with this scope applies to this caller. */
  allows(scope: string): boolean {
    return scope === 'all' || this.auth.scopes.includes(scope);
  }
}

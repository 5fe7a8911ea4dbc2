// What the TypeScript SDK gained beside the Python one, as skills for the end-to-end test
// (tests/typescript/test_typescript_parity.py): observers, hold-back windows, on_compaction
// hooks in both forms. Each writes one JSON line per call to HOOKBUS_TS_JOURNAL.
import { Skill, hook, HookError } from 'hookbus';
import type { Compaction, Context, HookData } from 'hookbus';
import { appendFileSync } from 'node:fs';

function note(cid: string | null, hookName: string, extra: Record<string, unknown> = {}): void {
  const line = JSON.stringify({ lang: 'ts', cid, hook: hookName, ...extra });
  if (process.env.HOOKBUS_TS_JOURNAL) appendFileSync(process.env.HOOKBUS_TS_JOURNAL, line + '\n');
}

const PHRASE = 'top secret';
const WINDOW = 16;

/** A blocking hook and observers: the observers see the stage as it ended, after the request. */
export class Audit extends Skill {
  readonly name = 'ts-audit';

  @hook({ lifecycle: 'on_message', priority: 10 })
  async mark(data: HookData, ctx: Context) {
    ctx.state.ts_marked = `${data.messages?.length ?? 0} messages`;
  }

  @hook({ lifecycle: 'on_connection', priority: 10, observe: true })
  async started(data: HookData, ctx: Context) {
    ctx.state.audit_started = ctx.call.stage_started;
  }

  @hook({ lifecycle: 'on_chunk', priority: 10, observe: true })
  async chunk(data: HookData, ctx: Context) {
    ctx.state.chunks = Number(ctx.state.chunks ?? 0) + 1;
    ctx.state.full = data.full_content;
  }

  @hook({ lifecycle: 'finalize_connection', priority: 90, observe: true })
  async finished(data: HookData, ctx: Context) {
    const began = Date.now() / 1000;
    await new Promise((resolve) => setTimeout(resolve, 2000)); // a slow observer: nobody waits for it
    note(ctx.completion_id, 'ts-audit.finished', {
      began, ended: Date.now() / 1000, stage_started: ctx.call.stage_started, stage_ended: ctx.call.stage_ended,
      audit_started: ctx.state.audit_started, ts_marked: ctx.state.ts_marked, chunks: ctx.state.chunks ?? 0,
      full: ctx.state.full ?? null, last: data.messages?.at(-1)?.content ?? null, error: data.error?.status_code ?? null,
      attempt: ctx.call.attempt,
    });
  }
}

/** The same check with a window (scope `held`) and without (scope `plain`). */
export class PhraseGuard extends Skill {
  readonly name = 'ts-phrase-guard';

  private judge(data: HookData): void {
    if ((data.full_content ?? '').includes(PHRASE)) throw new HookError(451, 'content_blocked', 'the answer contained a blocked phrase');
  }

  @hook({ lifecycle: 'on_chunk', priority: 20, scope: 'held', holdBack: WINDOW })
  async held(data: HookData) {
    this.judge(data);
  }

  @hook({ lifecycle: 'on_chunk', priority: 20, scope: 'plain' })
  async plain(data: HookData) {
    this.judge(data);
  }
}

/** Replaces the phrase with "[filtered]" in the held text once its last piece came. */
export class PhraseFilter extends Skill {
  readonly name = 'ts-phrase-filter';

  @hook({ lifecycle: 'on_chunk', priority: 20, scope: 'filter', holdBack: WINDOW })
  async rewrite(data: HookData) {
    const text = (data.held ?? '') + (data.content ?? '');
    if (text.includes(PHRASE)) {
      data.held = text.replace(PHRASE, '[filtered]');
      data.content = '';
    }
  }
}

/** on_compaction in both forms: the method (called with the outcome) and a decorated hook. */
export class CompactionNotes extends Skill {
  readonly name = 'ts-compaction';

  async onCompaction(outcome: Compaction, ctx?: Context) {
    note(ctx?.completion_id ?? null, 'ts-compaction.onCompaction', { id: outcome.id, stage: outcome.stage, before: outcome.before, after: outcome.after });
  }

  @hook({ lifecycle: 'on_compaction', priority: 60 })
  async noted(data: HookData, ctx: Context) {
    note(ctx.completion_id, 'ts-compaction.noted', { id: data.compaction?.id, between_turns: data.between_turns });
  }
}

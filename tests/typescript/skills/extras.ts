// Skills the end-to-end test adds beside the page's examples (exported, unlike those):
// a billing check that refuses with a 402, two tools (one of them the dangerous one the
// SecuritySkill blocks), and a probe of ctx.state across the two languages.
import { Skill, hook, tool, PaymentRequired } from 'hookbus';
import type { HookData, Context } from 'hookbus';
import { appendFileSync } from 'node:fs';

function note(ctx: Context, hookName: string, extra: Record<string, unknown> = {}): void {
  const line = JSON.stringify({ lang: 'ts', cid: ctx.metadata.completion_id, hook: hookName, ...extra });
  if (process.env.HOOKBUS_TS_JOURNAL) appendFileSync(process.env.HOOKBUS_TS_JOURNAL, line + '\n');
}

export class Billing extends Skill {
  readonly name = 'ts-billing';

  @hook({ lifecycle: 'on_connection', priority: 2, scope: 'metered' })
  async charge(data: HookData, ctx: Context): Promise<HookData> {
    note(ctx, 'ts-billing.charge');
    throw new PaymentRequired('no credit left', { balance: 0 });
  }
}

export class Toolbox extends Skill {
  readonly name = 'toolbox';

  @tool({ description: 'Delete everything under /. Never to be run.' })
  async rm_rf_root(_args: Record<string, never>, ctx: Context): Promise<string> {
    note(ctx, 'toolbox.rm_rf_root');
    return 'everything is gone';
  }

  @tool({
    name: 'word_count',
    description: 'Count the words of a text.',
    parameters: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
  })
  async countWords(args: { text: string }, ctx: Context): Promise<{ words: number }> {
    note(ctx, 'toolbox.word_count', { text: args.text });
    return { words: args.text.split(/\s+/).filter(Boolean).length };
  }
}

export class StateProbe extends Skill {
  readonly name = 'state-probe';

  /** Between the Python hooks at 30 and 60: sees what Python put in ctx.state, adds its
   * own; counts the conversation's requests in ctx.session (persisted per session). */
  @hook({ lifecycle: 'on_connection', priority: 40 })
  async relay(data: HookData, ctx: Context): Promise<void> {
    note(ctx, 'state-probe.relay', { py_mark: ctx.state.py_mark ?? null });
    ctx.state.ts_mark = `ts saw ${String(ctx.state.py_mark)}`;
    ctx.session.data.ts_visits = Number(ctx.session.data.ts_visits ?? 0) + 1;
  }
}

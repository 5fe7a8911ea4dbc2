// The conformance kit's probe skill (docs/conformance.md, "Probe"), the TypeScript twin of
// hookbus.services.protocol.conformance.skills:Probe: the same skill name, method names,
// lifecycles, priorities, options and behaviour, so that `hookbus conformance` can check
// the TypeScript worker as it checks the Python one:
//
//   hookbus conformance -- npx --prefix skills/typescript hookbus-worker --group conformance \
//       --claim-idle 2 skills/typescript/conformance/probe.ts
import { Skill, hook, tool, HookError } from 'hookbus';
import type { Context, HookData } from 'hookbus';

/** What a recording hook copies of each lifecycle's data (the fields not null). */
const FIELDS: Record<string, readonly string[]> = {
  on_connection: ['messages', 'stream'],
  before_llm_call: ['messages', 'tools', 'iteration'],
  after_llm_call: ['response', 'usage', 'iteration'],
  on_chunk: ['chunk', 'content', 'chunk_index', 'full_content'],
  before_toolcall: ['tool_call', 'tool_id'],
  after_toolcall: ['tool_call', 'tool_id', 'tool_result'],
  on_message: ['messages'],
  finalize_connection: ['messages', 'usage', 'error'],
};

function mode(ctx: Context): string {
  return String(ctx.metadata.conformance ?? '');
}

/** Append `name` to the order (not on_chunk) and a copy of the lifecycle's fields to what `name` saw. */
function record(name: string, data: HookData, ctx: Context): void {
  const lifecycle = data.lifecycle;
  if (lifecycle !== 'on_chunk') {
    const order = (ctx.state.order ??= []) as string[];
    order.push(`${name}:${lifecycle}`);
  }
  const copy: Record<string, unknown> = {};
  for (const field of FIELDS[lifecycle] ?? []) {
    const value = (data as unknown as Record<string, unknown>)[field];
    if (value !== null && value !== undefined) copy[field] = structuredClone(value);
  }
  const seen = (ctx.state.seen ??= {}) as Record<string, Record<string, unknown[]>>;
  const mine = (seen[name] ??= {});
  (mine[lifecycle] ??= []).push(copy);
}

/** The limits the kit gives the worker (HOOKBUS_MAX_STATE_BYTES, HOOKBUS_MAX_HOP_BYTES), and
 * what the modes `big_state` and `big_data` write: over the state limit, over the hop's. */
const KIT_MAX_STATE_BYTES = 512 * 1024;
const KIT_MAX_HOP_BYTES = 1024 * 1024;
const OVER_STATE = 'x'.repeat(KIT_MAX_STATE_BYTES + 1024);
const OVER_HOP = 'y'.repeat(KIT_MAX_HOP_BYTES + 1024);

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class Probe extends Skill {
  readonly name = 'probe';

  @hook({ lifecycle: 'on_connection', priority: 20 })
  async connection(data: HookData, ctx: Context) {
    record('probe', data, ctx);
    ctx.state.probe_token = ctx.state.token ?? null;
    if (ctx.session.id !== null) {
      ctx.session.data.probe_visits = Number(ctx.session.data.probe_visits ?? 0) + 1;
    }
    if (mode(ctx) === 'change') {
      const last = data.messages!.at(-1)!;
      last.content = String(last.content).replace('change me', 'changed by probe');
      return data;
    }
    if (mode(ctx) === 'raise') {
      data.messages = [{ role: 'user', content: '[[echo]] a change that must be discarded' }];
      throw new Error('probe raised');
    }
    return undefined;
  }

  @hook({ lifecycle: 'on_connection', priority: 21, critical: true })
  async guard(data: HookData, ctx: Context) {
    if (mode(ctx) === 'critical') throw new Error('probe guard is down');
  }

  @hook({ lifecycle: 'on_connection', priority: 22, timeout: 0.5 })
  async slow(data: HookData, ctx: Context) {
    if (mode(ctx) === 'timeout') await sleep(5000);
  }

  @hook({ lifecycle: 'on_connection', priority: 23, timeout: 60 })
  async hold(data: HookData, ctx: Context) {
    if (mode(ctx) === 'kill') {
      if (ctx.call.attempt === 1) await sleep(60_000); // the kit kills the worker meanwhile
      ctx.state.hold_attempt = ctx.call.attempt;
    }
  }

  @hook({ lifecycle: 'before_llm_call', priority: 20 })
  async before_llm(data: HookData, ctx: Context) {
    record('probe', data, ctx);
    if (mode(ctx) === 'hook_error') throw new HookError(429, 'probe_limit', 'probe says slow down', { retry_after: 7 });
    if (mode(ctx) === 'big_state') ctx.state.blob = OVER_STATE;
    if (mode(ctx) === 'big_data') {
      data.messages = [{ role: 'user', content: OVER_HOP }];
      return data;
    }
    return undefined;
  }

  @hook({ lifecycle: 'after_llm_call', priority: 20 })
  async after_llm(data: HookData, ctx: Context) {
    record('probe', data, ctx);
  }

  @hook({ lifecycle: 'on_chunk', priority: 20 })
  async chunk(data: HookData, ctx: Context) {
    record('probe', data, ctx);
    if (mode(ctx) === 'change' && data.content) {
      data.content = data.content.toUpperCase();
      return data;
    }
    return undefined;
  }

  @hook({ lifecycle: 'before_toolcall', priority: 20 })
  async before_tool(data: HookData, ctx: Context) {
    record('probe', data, ctx);
    if (mode(ctx) === 'raise') throw new Error('probe blocks the tool');
  }

  @hook({ lifecycle: 'after_toolcall', priority: 20 })
  async after_tool(data: HookData, ctx: Context) {
    record('probe', data, ctx);
    if (mode(ctx) === 'change') {
      data.tool_result = `${data.tool_result} (seen by probe)`;
      return data;
    }
    return undefined;
  }

  @hook({ lifecycle: 'on_message', priority: 20 })
  async message(data: HookData, ctx: Context) {
    record('probe', data, ctx);
  }

  @hook({ lifecycle: 'finalize_connection', priority: 20 })
  async finalize(data: HookData, ctx: Context) {
    record('probe', data, ctx);
  }

  @tool({
    description: 'Echo the text back.',
    parameters: { type: 'object', properties: { text: { type: 'string', title: 'Text' } }, required: ['text'], additionalProperties: false },
  })
  async probe_echo(args: { text: string }, ctx: Context) {
    ctx.state.tool_ran = true;
    return `echo: ${args.text}`;
  }
}

// One hop in, one reply out (no Redis): the failure rules, the split format's "d only when
// changed", batched on_chunk hops, tools, on_compaction, ctx.state and ctx.session.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Skill, hook, tool, HookError, PaymentRequired, type HookData, type Context } from '../src/index.ts';
import { GroupHost } from '../src/worker/host.ts';
import type { HopEvent } from '../src/wire/envelopes.ts';

class Chain extends Skill {
  readonly name = 'chain';

  @hook({ lifecycle: 'on_message', priority: 1 })
  async look(data: HookData, ctx: Context) {
    ctx.state.looked = true;
    return undefined; // unchanged
  }

  @hook({ lifecycle: 'on_message', priority: 2 })
  async append(data: HookData, ctx: Context) {
    data.messages!.push({ role: 'assistant', content: 'added' });
    ctx.session.data.visits = Number(ctx.session.data.visits ?? 0) + 1;
    return data;
  }

  @hook({ lifecycle: 'on_message', priority: 3 })
  async sees(data: HookData, ctx: Context) {
    ctx.state.saw = data.messages!.at(-1)!.content;
    return data;
  }

  @hook({ lifecycle: 'on_connection' })
  async broken(data: HookData, ctx: Context) {
    ctx.state.half = 'done';
    data.messages!.push({ role: 'user', content: 'half' });
    throw new TypeError('oops');
  }

  @hook({ lifecycle: 'on_connection', critical: true })
  async brokenCritical(data: HookData) {
    if (data.messages!.length > 1) throw new Error('critical oops');
  }

  @hook({ lifecycle: 'on_connection', guard: true })
  async guardRequest() {
    throw new Error('verdict service down');
  }

  @hook({ lifecycle: 'before_toolcall' })
  async guardTools(data: HookData) {
    if (data.tool_call!.function.name === 'rm_rf_root') throw new Error('Tool blocked: rm_rf_root');
  }

  @hook({ lifecycle: 'after_llm_call', timeout: 0.05 })
  async slow(data: HookData) {
    await new Promise((r) => setTimeout(r, 500));
    return data;
  }

  @hook({ lifecycle: 'after_llm_call' })
  async wrongReturn() {
    return 42 as unknown as HookData;
  }

  @hook({ lifecycle: 'after_toolcall' })
  async bill() {
    throw new PaymentRequired('no credit left', { balance: 0 });
  }

  @hook({ lifecycle: 'finalize_connection', priority: 1 })
  async finalizeFails() {
    throw new HookError(500, 'x', 'finalize failed');
  }

  @hook({ lifecycle: 'finalize_connection', priority: 2 })
  async finalizeRuns(data: HookData, ctx: Context) {
    ctx.state.error_status = data.error?.status_code;
  }

  @hook({ lifecycle: 'on_chunk', priority: 1 })
  async upper(data: HookData, ctx: Context) {
    ctx.state.fulls = [...((ctx.state.fulls as string[]) ?? []), data.full_content];
    if (data.content === ' b') data.chunk.choices[0].delta.content = '[B]';
    if (data.content === ' stop') throw new HookError(451, 'stopped', 'stop here', { at: data.chunk_index });
  }

  @tool({ parameters: { type: 'object', properties: { x: { type: 'number' } }, required: ['x'] } })
  async double(args: { x: number }, ctx: Context) {
    ctx.state.doubled = true;
    return { result: args.x * 2 };
  }

  @tool()
  async explode() {
    throw new RangeError('kaboom');
  }

  async onCompaction(outcome: { stage: string }, ctx?: Context) {
    if (ctx) ctx.state.compaction = outcome.stage;
  }
}

const host = new GroupHost('g', [new Chain()]);
const ctxJson = (extra: object = {}) =>
  JSON.stringify({ auth: { peer_user_id: 'u', scopes: [] }, metadata: { completion_id: 'cmpl-1', model: 'm', agent_name: 'a' }, session: { id: 's', data: { visits: 1 } }, state: { from: 'python' }, ...extra });

function hop(lifecycle: string, hooks: string[], extra: Partial<HopEvent> = {}): HopEvent {
  return {
    v: 2, kind: 'hop', hop_id: 'h1', completion_id: 'cmpl-1', lifecycle, stage_key: lifecycle,
    hooks: hooks.map((m) => ({ skill: 'chain', method: m })), ctx: {}, reply_to: 'r', deadline: Date.now() / 1000 + 30,
    epoch: 0, chunks: 0, ...extra,
  };
}

test('each hook sees the previous one; undefined is unchanged; state and session go back', async () => {
  const d = JSON.stringify({ lifecycle: 'on_message', messages: [{ role: 'user', content: 'hi' }] });
  const { reply, dataJson } = await host.answer(hop('on_message', ['look', 'append', 'sees']), 1, 'rep', [ctxJson(), d]);
  assert.equal(reply.failure, undefined);
  assert.deepEqual(JSON.parse(dataJson!).messages.at(-1), { role: 'assistant', content: 'added' });
  assert.deepEqual(reply.state, { from: 'python', looked: true, saw: 'added' });
  assert.deepEqual(reply.session, { visits: 2 });
  assert.deepEqual(reply.outcomes.map((o) => [o.hook, o.outcome]), [['chain.look', 'ok'], ['chain.append', 'ok'], ['chain.sees', 'ok']]);

  const unchanged = await host.answer(hop('on_message', ['look']), 1, 'rep', [ctxJson(), d]);
  assert.equal(unchanged.dataJson, undefined); // no `d` in the reply when nothing changed
});

test('a plain exception is logged, its changes to data and state undone, the chain goes on', async () => {
  const d = JSON.stringify({ lifecycle: 'on_connection', messages: [{ role: 'user', content: 'hi' }], stream: true });
  const { reply, dataJson } = await host.answer(hop('on_connection', ['broken', 'brokenCritical']), 1, 'rep', [ctxJson(), d]);
  assert.equal(dataJson, undefined);
  assert.deepEqual(reply.state, { from: 'python' });
  assert.deepEqual(reply.outcomes.map((o) => [o.outcome, o.error]), [['failed', 'TypeError: oops'], ['ok', undefined]]);
  assert.equal(reply.abort, undefined);
});

test('critical: a plain exception aborts the run as a 500', async () => {
  const d = JSON.stringify({ lifecycle: 'on_connection', messages: [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }] });
  const { reply } = await host.answer(hop('on_connection', ['brokenCritical']), 1, 'rep', [ctxJson(), d]);
  assert.deepEqual(reply.abort, { type: 'HookError', status_code: 500, code: 'hook_failed', message: 'critical hook chain.brokenCritical failed: Error: critical oops', details: null });
});

test('guard: a failure refuses the request with 503 guard_unavailable', async () => {
  const d = JSON.stringify({ lifecycle: 'on_connection', messages: [] });
  const { reply } = await host.answer(hop('on_connection', ['guardRequest']), 1, 'rep', [ctxJson(), d]);
  assert.deepEqual(reply.abort, {
    type: 'GuardUnavailable', status_code: 503, code: 'guard_unavailable', details: null,
    message: 'the guard chain.guardRequest could not check this request: Error: verdict service down',
  });
});

test('before_toolcall: a plain exception blocks the tool call', async () => {
  const d = JSON.stringify({ lifecycle: 'before_toolcall', tool_call: { id: 'c1', function: { name: 'rm_rf_root', arguments: '{}' } }, tool_id: 'c1' });
  const { reply, dataJson } = await host.answer(hop('before_toolcall', ['guardTools']), 1, 'rep', [ctxJson(), d]);
  assert.equal(reply.blocked, true);
  const data = JSON.parse(dataJson!);
  assert.equal(data.tool_skipped, true);
  assert.equal(data.tool_result, 'Tool call blocked by chain.guardTools: Error: Tool blocked: rm_rf_root');
  assert.equal(reply.outcomes[0]!.outcome, 'blocked');
});

test('a timeout and a wrong return value count as failures', async () => {
  const d = JSON.stringify({ lifecycle: 'after_llm_call', response: { id: 'x' } });
  const { reply } = await host.answer(hop('after_llm_call', ['slow', 'wrongReturn']), 1, 'rep', [ctxJson(), d]);
  assert.deepEqual(reply.outcomes.map((o) => [o.outcome, o.error]), [
    ['timeout', 'timed out after 0.05s'],
    ['failed', 'returned number, expected HookData or undefined'],
  ]);
});

test('a HookError aborts with its status, code, message and details; in finalize every hook runs', async () => {
  const d = JSON.stringify({ lifecycle: 'after_toolcall', tool_result: 'r' });
  const { reply } = await host.answer(hop('after_toolcall', ['bill']), 1, 'rep', [ctxJson(), d]);
  assert.deepEqual(reply.abort, { type: 'PaymentRequired', status_code: 402, code: 'payment_required', message: 'no credit left', details: { balance: 0 } });

  const f = JSON.stringify({ lifecycle: 'finalize_connection', error: { type: 'PaymentRequired', status_code: 402, code: 'payment_required', message: 'm', details: null } });
  const fin = await host.answer(hop('finalize_connection', ['finalizeFails', 'finalizeRuns']), 1, 'rep', [ctxJson(), f]);
  assert.equal(fin.reply.abort, undefined);
  assert.equal(fin.reply.state.error_status, 402);
  assert.deepEqual(fin.reply.outcomes.map((o) => o.outcome), ['aborted', 'ok']);
});

test('a batched on_chunk hop: full_content rebuilt, null for unchanged chunks, stops at a HookError', async () => {
  const chunk = (content: string, index: number) => ({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content } }] });
  const items = [' a', ' b', ' c', ' stop', ' never'].map((content, i) => ({ lifecycle: 'on_chunk', chunk: chunk(content, i), content, chunk_index: i }));
  (items[0] as Record<string, unknown>).full_content = ' a';
  const { reply, dataJson } = await host.answer(hop('on_chunk', ['upper'], { chunks: 5 }), 1, 'rep', [ctxJson(), JSON.stringify(items)]);
  assert.equal(reply.processed, 4);
  assert.deepEqual(reply.abort, { type: 'HookError', status_code: 451, code: 'stopped', message: 'stop here', details: { at: 3 } });
  const results = JSON.parse(dataJson!);
  assert.equal(results.length, 4);
  assert.equal(results[0], null);
  assert.equal(results[1].chunk.choices[0].delta.content, '[B]');
  assert.equal(results[2], null);
  assert.deepEqual(reply.state.fulls, [' a', ' a b', ' a b c']); // the aborting call's state change is undone
  assert.equal(reply.outcomes.length, 1); // one timing per hook for the whole batch
});

test('a protocol 1.1 batch: no text so far on the wire, full_content from the text this replica keeps, a gap for what it lacks, needs_text when it has none', async () => {
  const chunk = (content: string) => ({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content } }] });
  // as the orchestrator writes 1.1 chunks: no content where it is the chunk's own text, no full_content
  const batch = (words: string[], first: number) => JSON.stringify(words.map((w, i) => ({ lifecycle: 'on_chunk', chunk: chunk(w), chunk_index: first + i })));
  const text = (extra: Record<string, unknown> = {}) => ({ stream: 's1', start: 4, ...extra });
  const one = new GroupHost('g', [new Chain()]);
  const first = await one.answer(hop('on_chunk', ['upper'], { chunks: 2, text: text() }), 1, 'one', [ctxJson(), batch([' a', ' b'], 4)]);
  assert.equal(first.reply.processed, 2);
  assert.deepEqual(first.reply.state.fulls, [' a', ' a b']);
  const results = JSON.parse(first.dataJson!);
  assert.equal(results[0], null);
  assert.equal(results[1].chunk.choices[0].delta.content, '[B]');
  assert.equal(results[1].content, undefined); // it followed the rewrite (the chunk's text), so it stays off the wire
  assert.equal(results[1].full_content, undefined); // never the text so far
  const next = await one.answer(hop('on_chunk', ['upper'], { chunks: 1, text: text() }), 1, 'one', [ctxJson(), batch([' c'], 6)]);
  assert.deepEqual(next.reply.state.fulls, [' a b c']); // extended from what it kept
  assert.equal(next.dataJson, undefined);
  const other = new GroupHost('g', [new Chain()]);
  const asks = await other.answer(hop('on_chunk', ['upper'], { chunks: 1, text: text() }), 1, 'two', [ctxJson(), batch([' d'], 7)]);
  assert.equal(asks.reply.needs_text, true); // it never saw the stream: no hook ran
  assert.equal(asks.reply.processed, 0);
  assert.equal(asks.reply.state.fulls, undefined);
  const whole = await other.answer(hop('on_chunk', ['upper'], { chunks: 1, text: text({ gap_from: 4, gap: [' a', ' b', ' c'] }) }), 1, 'two', [ctxJson(), batch([' d'], 7)]);
  assert.deepEqual(whole.reply.state.fulls, [' a b c d']);
  const gap = await one.answer(hop('on_chunk', ['upper'], { chunks: 1, text: text({ gap_from: 7, gap: [' d'] }) }), 1, 'one', [ctxJson(), batch([' e'], 8)]);
  assert.deepEqual(gap.reply.state.fulls, [' a b c d e']); // what it kept, then the gap it lacked
});

test('a batched on_chunk hop with a hold-back window: each chunk sees the held text as the earlier ones left it; only a rewrite goes back', async () => {
  class Redact extends Skill {
    readonly name = 'redact';

    @hook({ lifecycle: 'on_chunk', priority: 10, holdBack: 32 })
    async redact(data: HookData, ctx: Context) {
      ((ctx.state.seen ??= []) as unknown[]).push(data.held);
      const text = (data.held ?? '') + (data.content ?? '');
      if (text.includes('top secret')) {
        data.held = text.replace('top secret', '[filtered]');
        data.content = '';
      }
    }
  }
  const chunk = (content: string) => ({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content } }] });
  const items: Array<Record<string, unknown>> = [' the', ' top', ' secret', ' plan'].map((content, i) => ({ lifecycle: 'on_chunk', chunk: chunk(content), content, chunk_index: i + 1 }));
  Object.assign(items[0]!, { full_content: 'Here is the', held: 'Here is' });
  const redact = new GroupHost('r', [new Redact()]);
  const { reply, dataJson } = await redact.answer({ ...hop('on_chunk', [], { chunks: 4 }), hooks: [{ skill: 'redact', method: 'redact' }] }, 1, 'rep', [ctxJson(), JSON.stringify(items)]);
  assert.equal(reply.failure, undefined);
  assert.deepEqual(reply.state.seen, ['Here is', 'Here is the', 'Here is the top', 'Here is the [filtered]']);
  const results = JSON.parse(dataJson!);
  assert.deepEqual(results.map((r: { held?: string } | null) => r && r.held), [null, null, 'Here is the [filtered]', null]);
  assert.equal(results[2].content, '');
  // the first chunk's held (from the wire) is kept as it came; no window, no held
  const plain = await host.answer(hop('on_chunk', ['upper'], { chunks: 1 }), 1, 'rep', [ctxJson(), JSON.stringify([{ lifecycle: 'on_chunk', chunk: chunk(' a'), content: ' a', chunk_index: 0, full_content: ' a' }])]);
  assert.equal(plain.dataJson, undefined);
});

test('tools: arguments in, the result as text; a failure is text for the model', async () => {
  const tool = (name: string, args: Record<string, unknown>) => hop('before_toolcall', [], { v: 1, tool: { name, arguments: args }, ctx: JSON.parse(ctxJson()) });
  const ok = await host.answer(tool('double', { x: 21 }), 1, 'rep');
  assert.equal(ok.reply.tool_result, '{"result":42}');
  assert.equal(ok.reply.state.doubled, true);
  assert.equal((await host.answer(tool('double', {}), 1, 'rep')).reply.tool_result, "Error: invalid arguments for tool 'double': x: Field required");
  assert.equal((await host.answer(tool('explode', {}), 1, 'rep')).reply.tool_result, "Error: tool 'explode' failed: RangeError: kaboom");
});

test('an on_compaction hop (version 2, as the orchestrator sends it) runs the onCompaction method form', async () => {
  const compaction = { stage: 'summarized', messages: [], before: 900, after: 300, window: 1000, target: 500, id: 'cmp-1' };
  const d = (betweenTurns: boolean) => JSON.stringify({ lifecycle: 'on_compaction', compaction, between_turns: betweenTurns });
  const { reply, dataJson } = await host.answer(hop('on_compaction', ['onCompaction']), 1, 'rep', [ctxJson(), d(false)]);
  assert.equal(reply.failure, undefined);
  assert.equal(reply.state.compaction, 'summarized');
  assert.equal(dataJson, undefined); // nothing is writable at on_compaction
  assert.deepEqual(reply.outcomes.map((o) => [o.hook, o.outcome]), [['chain.onCompaction', 'ok']]);
  // between turns the method gets no context
  const between = await host.answer(hop('on_compaction', ['onCompaction']), 1, 'rep', [ctxJson(), d(true)]);
  assert.equal(between.reply.state.compaction, undefined);
  assert.deepEqual(host.announcement().hooks.filter((h) => h.lifecycle === 'on_compaction').map((h) => [h.method, h.priority]), [['onCompaction', 50]]);
  assert.equal('compaction' in host.announcement(), false);
});

test('a decorated on_compaction hook: a HookError there is logged, every hook runs (a notification point)', async () => {
  class Notified extends Skill {
    readonly name = 'notified';

    @hook({ lifecycle: 'on_compaction', priority: 1 })
    async first() {
      throw new HookError(500, 'nope', 'not at a notification point');
    }

    @hook({ lifecycle: 'on_compaction', priority: 2 })
    async second(data: HookData, ctx: Context) {
      ctx.state.second = data.compaction?.stage;
    }
  }
  const d = JSON.stringify({ lifecycle: 'on_compaction', compaction: { stage: 'cleared', messages: [], before: 1, after: 1, window: 1 }, between_turns: false });
  const event = { ...hop('on_compaction', []), hooks: [{ skill: 'notified', method: 'first' }, { skill: 'notified', method: 'second' }] };
  const { reply } = await new GroupHost('n', [new Notified()]).answer(event, 1, 'rep', [ctxJson(), d]);
  assert.equal(reply.abort, undefined);
  assert.equal(reply.state.second, 'cleared');
  assert.deepEqual(reply.outcomes.map((o) => o.outcome), ['aborted', 'ok']);
});

test('an unknown hook fails the hop as a whole', async () => {
  const { reply } = await host.answer(hop('on_message', ['nope']), 1, 'rep', [ctxJson(), '{"lifecycle":"on_message"}']);
  assert.equal(reply.failure, "group 'g' has no hook 'chain.nope'");
});

test('on_chunk: content follows a rewrite of the chunk, the chunk a rewrite of content; full_content stays the model\'s', async () => {
  class Rewrite extends Skill {
    readonly name = 'rewrite';

    @hook({ lifecycle: 'on_chunk', priority: 1 })
    async viaChunk(data: HookData) {
      if (data.content === ' b') data.chunk.choices[0].delta.content = '[filtered]';
    }

    @hook({ lifecycle: 'on_chunk', priority: 2 })
    async viaContent(data: HookData) {
      if (data.content === ' c') data.content = '[C]';
    }

    @hook({ lifecycle: 'on_chunk', priority: 3 })
    async sees(data: HookData, ctx: Context) {
      const seen = (ctx.state.seen ??= []) as unknown[];
      seen.push([data.content, data.chunk.choices[0].delta.content, data.full_content]);
    }
  }
  const rewrite = new GroupHost('g', [new Rewrite()]);
  const chunk = (content: string) => ({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content } }] });
  const items: Array<Record<string, unknown>> = [' a', ' b', ' c'].map((content, i) => ({ lifecycle: 'on_chunk', chunk: chunk(content), content, chunk_index: i }));
  items[0]!.full_content = ' a';
  const hooks = ['viaChunk', 'viaContent', 'sees'].map((method) => ({ skill: 'rewrite', method }));
  const { reply, dataJson } = await rewrite.answer({ ...hop('on_chunk', [], { chunks: 3 }), hooks }, 1, 'rep', [ctxJson(), JSON.stringify(items)]);
  assert.deepEqual(reply.state.seen, [[' a', ' a', ' a'], ['[filtered]', '[filtered]', ' a b'], ['[C]', '[C]', ' a b c']]);
  const results = JSON.parse(dataJson!);
  assert.equal(results[0], null);
  assert.deepEqual([results[1].content, results[1].chunk.choices[0].delta.content], ['[filtered]', '[filtered]']);
  assert.deepEqual([results[2].content, results[2].chunk.choices[0].delta.content], ['[C]', '[C]']);
});

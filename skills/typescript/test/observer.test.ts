// The observer half of a replica on a real Redis, fed `observe:{group}` entries as the
// Python orchestrator writes them (hookbus.bus.wire.observations.BatchWriter): stages in
// order with their state and full_content rebuilt, the observers' own state carried from
// stage to stage, the ack, the `observe` monitor records, dead letters, and the claim of
// a dead replica's entry.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Skill, hook, type HookData, type Context } from '../src/index.ts';
import { GroupHost } from '../src/worker/host.ts';
import { WorkerReplica } from '../src/worker/replica.ts';
import { pairs } from '../src/bus/claims.ts';
import { redisForTests, waitFor } from './redis.ts';

interface Call {
  hook: string;
  cid: string;
  state: Record<string, unknown>;
  full?: string | null;
  content?: string | null;
  attempt: number;
  stage: [number | null | undefined, number | null | undefined];
}

const calls: Call[] = [];

class Watch extends Skill {
  readonly name = 'watch';

  @hook({ lifecycle: 'on_message', priority: 1 })
  async blocking(data: HookData) {
    return data; // a blocking hook beside the observers: the group still serves hops
  }

  @hook({ lifecycle: 'on_connection', observe: true })
  async connected(data: HookData, ctx: Context) {
    calls.push(call('connected', ctx));
    ctx.state.watched_since = ctx.call.stage_started;
  }

  @hook({ lifecycle: 'on_chunk', observe: true })
  async chunk(data: HookData, ctx: Context) {
    calls.push({ ...call('chunk', ctx), full: data.full_content, content: data.content });
  }

  @hook({ lifecycle: 'finalize_connection', priority: 90, observe: true })
  async finished(data: HookData, ctx: Context) {
    calls.push(call('finished', ctx));
    if (ctx.metadata.completion_id === 'cmpl-fails') throw new Error('observer down');
  }
}

function call(name: string, ctx: Context): Call {
  return { hook: name, cid: ctx.completion_id, state: structuredClone(ctx.state), attempt: ctx.call.attempt, stage: [ctx.call.stage_started, ctx.call.stage_ended] };
}

const bus = redisForTests();

/** One request's observations as BatchWriter writes them: a state only where it changed,
 * a later on_chunk stage's text as `grow`. */
function observations(cid: string, missing = false): string[] {
  const ctx = { auth: { peer_user_id: 'u', scopes: [] }, metadata: { completion_id: cid, model: 'm', agent_name: 'a' }, session: { id: null, data: {} }, recovery: false, call: { idempotency_key: '', attempt: 1 } };
  const chunk = (content: string) => ({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content } }] });
  const stage = (lifecycle: string, key: string, hooks: string[], at: number, state: object | null, grow: string | null, data: object) => ({
    lifecycle, stage_key: key, hooks, started: at, ended: at + 0.5, state, grow, data: { lifecycle, ...data },
  });
  const stages = [
    stage('on_connection', 'on_connection', ['watch.connected'], 100, { py: 1 }, null, { messages: [{ role: 'user', content: 'hi' }], stream: true }),
    stage('on_chunk', 'on_chunk#0', ['watch.chunk'], 101, { py: 2 }, null, { chunk: chunk('Hel'), content: 'Hel', chunk_index: 0, full_content: 'Hel' }),
    stage('on_chunk', 'on_chunk#1', ['watch.chunk'], 102, null, 'lo', { chunk: chunk('lo'), content: 'lo', chunk_index: 1 }),
    stage('finalize_connection', 'finalize_connection', missing ? ['watch.finished', 'gone.hook'] : ['watch.finished'], 103, null, null, { messages: [] }),
  ];
  return ['e', JSON.stringify({ v: 1, kind: 'observations', completion_id: cid, group: 'obs', ctx, stages })];
}

function replica(prefix: string, options: { claimIdle?: number; maxDeliveries?: number } = {}): WorkerReplica {
  return new WorkerReplica(new GroupHost('obs', [new Watch()]), { redisUrl: bus.url, prefix, replica: 'obs-1', concurrency: 4, ...options });
}

async function events(prefix: string): Promise<Array<Record<string, unknown>>> {
  const entries = await bus.client.xrange(`${prefix}events`, '-', '+');
  return entries.flatMap(([, flat]) => JSON.parse(pairs(flat).e!).records as Array<Record<string, unknown>>);
}

test('an entry of observe:{group}: each stage in order, state and full_content rebuilt, the observers\' state carried, acked, recorded', async () => {
  const prefix = `o${randomUUID().slice(0, 8)}:`;
  calls.length = 0;
  const worker = replica(prefix);
  await worker.start();
  try {
    await bus.client.xadd(`${prefix}observe:obs`, '*', ...observations('cmpl-1'));
    await bus.client.xadd(`${prefix}observe:obs`, '*', ...observations('cmpl-fails', true));
    assert.ok(await waitFor(() => calls.filter((c) => c.hook === 'finished').length === 2), JSON.stringify(calls));
    const one = calls.filter((c) => c.cid === 'cmpl-1');
    assert.deepEqual(one.map((c) => [c.hook, c.full ?? null, c.attempt]), [['connected', null, 1], ['chunk', 'Hel', 1], ['chunk', 'Hello', 1], ['finished', null, 1]]);
    // the request's state at each stage (null: as at the one before), the observer's own key on top
    assert.deepEqual(one.map((c) => c.state), [{ py: 1 }, { py: 2, watched_since: 100 }, { py: 2, watched_since: 100 }, { py: 2, watched_since: 100 }]);
    assert.deepEqual(one.map((c) => c.stage), [[100, 100.5], [101, 101.5], [102, 102.5], [103, 103.5]]);
    const acked = await waitFor(async () => ((await bus.client.xpending(`${prefix}observe:obs`, 'obs')) as [number])[0] === 0);
    assert.ok(acked, 'the entries were not acked');
    const records = await waitFor(async () => {
      const got = (await events(prefix)).filter((r) => r.kind === 'observe');
      return got.length >= 6 ? got : null;
    });
    assert.ok(records);
    const of = (cid: string, lifecycle: string) => records.find((r) => r.completion_id === cid && r.lifecycle === lifecycle)!;
    assert.deepEqual([of('cmpl-1', 'on_chunk').hooks, of('cmpl-1', 'on_chunk').outcome, of('cmpl-1', 'on_chunk').group], [['watch.chunk'], 'ok', 'obs']);
    assert.deepEqual(of('cmpl-fails', 'finalize_connection').hooks, ['watch.finished', 'gone.hook']);
    assert.equal(of('cmpl-fails', 'finalize_connection').error, 'Error: observer down');
    assert.equal(worker.observer?.observed, 2);
  } finally {
    await worker.stop();
  }
});

test('an unreadable observation is dead-lettered; a dead replica\'s entry is claimed and run again, dead-lettered past max deliveries', async () => {
  const prefix = `o${randomUUID().slice(0, 8)}:`;
  calls.length = 0;
  const stream = `${prefix}observe:obs`;
  await bus.client.xgroup('CREATE', stream, 'obs', '0', 'MKSTREAM');
  const again = (await bus.client.xadd(stream, '*', ...observations('cmpl-again')))!;
  const worn = (await bus.client.xadd(stream, '*', ...observations('cmpl-worn')))!;
  await bus.client.xreadgroup('GROUP', 'obs', 'dead-1', 'COUNT', 2, 'STREAMS', stream, '>'); // read, never acked: its replica died
  await bus.client.xclaim(stream, 'obs', 'dead-1', 0, worn, 'RETRYCOUNT', 5);
  const worker = replica(prefix, { claimIdle: 0.3 });
  await worker.start();
  try {
    await bus.client.xadd(stream, '*', 'e', '{"v":1,"kind":"observations"', 'note', 'private text');
    const letters = await waitFor(async () => {
      const got = await bus.client.xrange(`${prefix}dead-letter`, '-', '+');
      return got.length >= 2 ? got.map(([, flat]) => pairs(flat)) : null;
    }, 15_000);
    assert.ok(letters);
    assert.ok(letters.some((l) => /not a valid ObservationBatch/.test(l.reason!)), JSON.stringify(letters));
    assert.ok(letters.some((l) => l.reason === 'delivered 6 times without being acked' && l.entry_id === worn), JSON.stringify(letters));
    assert.ok(!JSON.stringify(letters).includes('private text'));
    assert.ok(await waitFor(() => calls.some((c) => c.hook === 'finished')));
    assert.deepEqual([...new Set(calls.map((c) => [c.cid, c.attempt].join('@')))], ['cmpl-again@2']);
    assert.ok(await waitFor(async () => ((await bus.client.xpending(stream, 'obs')) as [number])[0] === 0));
    assert.ok(worker.observer!.member.claimed >= 2, `claimed ${worker.observer!.member.claimed}`);
    assert.ok(!letters.some((l) => l.entry_id === again));
  } finally {
    await worker.stop();
  }
  // a stopped replica leaves its consumer behind only if it still held something
  const consumers = (await bus.client.xinfo('CONSUMERS', stream, 'obs')) as string[][];
  assert.ok(!consumers.some((c) => c[c.indexOf('name') + 1] === 'obs-1'));
});

// The worker on a real Redis, fed entries exactly as the Python orchestrator writes them
// (hookbus.bus.envelopes.encode_hop): the reply, the ack, the announcement with its
// protocol version, the heartbeat, a stage sent on, dead letters, claims of a dead
// sibling's entries, and the command's drain on SIGTERM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { Skill, hook, type HookData, type Context } from '../src/index.ts';
import { GroupHost } from '../src/worker/host.ts';
import { WorkerReplica } from '../src/worker/replica.ts';
import { pairs } from '../src/bus/claims.ts';
import { PROTOCOL } from '../src/wire/envelopes.ts';
import { Keys } from '../src/bus/keys.ts';
import { redisForTests, waitFor } from './redis.ts';

class Stamp extends Skill {
  readonly name = 'stamp';

  @hook({ lifecycle: 'on_message', priority: 10 })
  async stamp(data: HookData, ctx: Context) {
    data.messages!.push({ role: 'assistant', content: `stamped on attempt ${ctx.call.attempt}` });
    ctx.state.stamped = (ctx.state.stamped as number | undefined ?? 0) + 1;
    return data;
  }
}

class Slow extends Skill {
  readonly name = 'slow';

  @hook({ lifecycle: 'after_llm_call' })
  async linger() {
    await new Promise((r) => setTimeout(r, 1500));
  }
}

const bus = redisForTests();

const ctx = { auth: { peer_user_id: null, scopes: [] }, metadata: { completion_id: 'cmpl-w', model: 'm', agent_name: 'a' }, session: { id: null, data: {} }, state: {} };
const data = { lifecycle: 'on_message', messages: [{ role: 'user', content: 'hi' }] };

function hopFields(prefix: string, hopId: string, extra: Record<string, unknown> = {}): string[] {
  const envelope = {
    v: 2, kind: 'hop', hop_id: hopId, completion_id: 'cmpl-w', lifecycle: 'on_message', stage_key: 'on_message',
    hooks: [{ skill: 'stamp', method: 'stamp' }], ctx: {}, reply_to: `${prefix}replies:orch`, deadline: Date.now() / 1000 + 30,
    epoch: 0, chunks: 0, ...extra,
  };
  return ['e', JSON.stringify(envelope), 'c', JSON.stringify(ctx), 'd', JSON.stringify(data)];
}

async function replies(prefix: string, count: number): Promise<Array<Record<string, string>>> {
  const entries = await waitFor(async () => {
    const got = await bus.client.xrange(`${prefix}replies:orch`, '-', '+');
    return got.length >= count ? got : null;
  });
  assert.ok(entries, `fewer than ${count} replies`);
  return entries.map(([, flat]) => pairs(flat));
}

function replica(prefix: string, options: { claimIdle?: number; maxDeliveries?: number } = {}): WorkerReplica {
  return new WorkerReplica(new GroupHost('tsw', [new Stamp(), new Slow()]), { redisUrl: bus.url, prefix, replica: 'tsw-1', concurrency: 4, ...options });
}

test('a hop is answered, acked, announced with the protocol version, heartbeats with a record, and sent on', async () => {
  const prefix = `w${randomUUID().slice(0, 8)}:`;
  const worker = replica(prefix);
  await worker.start();
  try {
    const announcement = JSON.parse((await bus.client.hget(`${prefix}registry`, 'tsw'))!);
    assert.equal(announcement.protocol, PROTOCOL);
    assert.equal(announcement.hooks[0].method, 'stamp');
    assert.equal(await bus.client.get(`${prefix}registry:version`), '1');
    assert.ok(Number(await bus.client.zscore(`${prefix}replicas:tsw`, 'tsw-1')) > Date.now() / 1000 - 5);
    const beat = JSON.parse((await bus.client.get(`${prefix}replica:tsw:tsw-1`))!);
    assert.deepEqual({ ...beat, ts: undefined }, { v: 1, kind: 'heartbeat', group: 'tsw', replica: 'tsw-1', protocol: PROTOCOL, ts: undefined });
    const ttl = await bus.client.ttl(`${prefix}replica:tsw:tsw-1`);
    assert.ok(ttl > 0 && ttl <= 10, `ttl ${ttl}`);

    const route = [{ group: 'next', stream: `${prefix}hooks:next`, hop_id: 'h-next', hooks: [{ skill: 'py', method: 'after' }], timeout: 5 }];
    await bus.client.xadd(`${prefix}hooks:tsw`, '*', ...hopFields(prefix, 'h-1', { route }));
    const [reply] = await replies(prefix, 1);
    const e = JSON.parse(reply!.e!);
    assert.equal(e.kind, 'reply');
    assert.equal(e.v, 2);
    assert.equal(e.hop_id, 'h-1');
    assert.equal(e.replica, 'tsw-1');
    assert.equal(e.forwarded, 'h-next');
    assert.deepEqual(e.state, { stamped: 1 });
    assert.equal(JSON.parse(reply!.d!).messages.at(-1).content, 'stamped on attempt 1');
    // the next group's hop: the changed data, the context with the hooks' state
    const [[, onwardFlat]] = (await bus.client.xrange(`${prefix}hooks:next`, '-', '+')) as Array<[string, string[]]>;
    const onward = pairs(onwardFlat!);
    assert.equal(JSON.parse(onward.e!).hop_id, 'h-next');
    assert.deepEqual(JSON.parse(onward.c!).state, { stamped: 1 });
    assert.equal(onward.d, reply!.d);
    const pending = await waitFor(async () => ((await bus.client.xpending(`${prefix}hooks:tsw`, 'tsw')) as [number])[0] === 0);
    assert.ok(pending, 'the entry was not acked');
  } finally {
    await worker.stop();
  }
  assert.equal(await bus.client.zscore(`${prefix}replicas:tsw`, 'tsw-1'), null); // left the registry
  assert.equal(await bus.client.exists(`${prefix}replica:tsw:tsw-1`), 0);
});

test('an unreadable entry is dead-lettered without its content; a known caller hears of it', async () => {
  const prefix = `w${randomUUID().slice(0, 8)}:`;
  const worker = replica(prefix);
  await worker.start();
  try {
    await bus.client.xadd(`${prefix}hooks:tsw`, '*', 'e', '{not json', 'secret', 'prompt text');
    await bus.client.xadd(`${prefix}hooks:tsw`, '*', ...hopFields(prefix, 'h-v9', { v: 9 }));
    await bus.client.xadd(`${prefix}hooks:tsw`, '*', ...hopFields(prefix, 'h-no-ctx').slice(0, 2)); // v2 without `c`
    const letters = await waitFor(async () => {
      const got = await bus.client.xrange(`${prefix}dead-letter`, '-', '+');
      return got.length >= 3 ? got.map(([, flat]) => pairs(flat)) : null;
    });
    assert.ok(letters);
    assert.match(letters[0]!.reason!, /not a valid HopEvent/);
    assert.ok(!JSON.stringify(letters).includes('prompt text'));
    assert.equal(JSON.parse(letters[0]!.original!).fields.secret.bytes, 'prompt text'.length);
    assert.match(letters[1]!.reason!, /unknown envelope version 9/);
    assert.equal(letters[2]!.reason, "version 2 hop without a 'c' field");
    // as the Python worker: only a readable hop names a caller to tell
    const [reply] = await replies(prefix, 1);
    assert.equal(JSON.parse(reply!.e!).hop_id, 'h-no-ctx');
    assert.equal(JSON.parse(reply!.e!).failure, "dead-lettered: version 2 hop without a 'c' field");
    assert.equal(((await bus.client.xpending(`${prefix}hooks:tsw`, 'tsw')) as [number])[0], 0);
  } finally {
    await worker.stop();
  }
});

test("a dead sibling's entry is claimed and run again; past max deliveries it is dead-lettered", async () => {
  const prefix = `w${randomUUID().slice(0, 8)}:`;
  const stream = `${prefix}hooks:tsw`;
  await bus.client.xgroup('CREATE', stream, 'tsw', '0', 'MKSTREAM');
  await bus.client.xadd(stream, '*', ...hopFields(prefix, 'h-orphan'));
  const worn = (await bus.client.xadd(stream, '*', ...hopFields(prefix, 'h-worn')))!;
  await bus.client.xreadgroup('GROUP', 'tsw', 'dead-sibling', 'COUNT', 2, 'STREAMS', stream, '>');
  await bus.client.xclaim(stream, 'tsw', 'dead-sibling', 0, worn, 'RETRYCOUNT', 3); // delivered 3 times already
  const worker = replica(prefix, { claimIdle: 0.2, maxDeliveries: 3 });
  await worker.start();
  try {
    const got = await replies(prefix, 2);
    const byHop = Object.fromEntries(got.map((r) => [JSON.parse(r.e!).hop_id, r]));
    assert.equal(JSON.parse(byHop['h-orphan']!.d!).messages.at(-1).content, 'stamped on attempt 2');
    assert.equal(JSON.parse(byHop['h-worn']!.e!).failure, 'dead-lettered: delivered 4 times without an answer');
    assert.equal(worker.claimed, 2);
  } finally {
    await worker.stop();
  }
});

test('hookbus-worker hosts a page-style .ts file and a .js file, and drains on SIGTERM', async () => {
  const prefix = `w${randomUUID().slice(0, 8)}:`;
  const bin = fileURLToPath(new URL('../bin/hookbus-worker.js', import.meta.url));
  const file = fileURLToPath(new URL('./fixtures/page_style.ts', import.meta.url));
  const js = fileURLToPath(new URL('./fixtures/plain_skills.js', import.meta.url));
  const child = spawn(process.execPath, [bin, '--group', 'cli', file, js, '--replica', 'cli-1'], {
    env: { ...process.env, REDIS_URL: bus.url, HOOKBUS_PREFIX: prefix, HOOKBUS_LOG_LEVEL: 'info' },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  try {
    const announced = await waitFor(async () => (await bus.client.zscore(`${prefix}replicas:cli`, 'cli-1')) !== null, 20_000);
    assert.ok(announced, `the worker never heartbeat:\n${stderr}`);
    const announcement = JSON.parse((await bus.client.hget(`${prefix}registry`, 'cli'))!);
    assert.deepEqual(announcement.hooks.map((h: { skill: string; method: string; priority: number }) => [h.skill, h.method, h.priority]), [['shouter', 'shout', 30], ['plain', 'note', 12]]);
  } finally {
    child.kill('SIGTERM');
  }
  assert.equal(await exited, 0, stderr);
  assert.match(stderr, /"event":"worker_stopped"/);
  assert.equal(await bus.client.zscore(`${prefix}replicas:cli`, 'cli-1'), null);
});

test('an expired hop is acked unanswered; hops are recorded on events; the janitor trims what was acked', async () => {
  const prefix = `w${randomUUID().slice(0, 8)}:`;
  const worker = replica(prefix);
  await worker.start();
  try {
    await bus.client.xadd(`${prefix}hooks:tsw`, '*', ...hopFields(prefix, 'h-late', { deadline: Date.now() / 1000 - 1 }));
    await bus.client.xadd(`${prefix}hooks:tsw`, '*', ...hopFields(prefix, 'h-ok'));
    const [reply] = await replies(prefix, 1);
    assert.equal(JSON.parse(reply!.e!).hop_id, 'h-ok');
    const records = await waitFor(async () => {
      const entries = await bus.client.xrange(`${prefix}events`, '-', '+');
      const all = entries.flatMap(([, flat]) => JSON.parse(pairs(flat).e!).records as Array<Record<string, unknown>>);
      return all.length >= 2 ? all : null;
    });
    assert.ok(records);
    assert.deepEqual(records.map((r) => [r.kind, r.outcome, r.group, r.replica]).sort(), [['hop', 'expired', 'tsw', 'tsw-1'], ['hop', 'ok', 'tsw', 'tsw-1']]);
    assert.equal((await bus.client.xrange(`${prefix}replies:orch`, '-', '+')).length, 1); // none for the late one
    assert.ok(await waitFor(async () => ((await bus.client.xpending(`${prefix}hooks:tsw`, 'tsw')) as [number])[0] === 0));
    assert.equal(await worker.janitorOnce(), 2);
    assert.equal(await bus.client.xlen(`${prefix}hooks:tsw`), 0);
  } finally {
    await worker.stop();
  }
});

test('a running hop keeps its claim fresh, so no sibling takes it', async () => {
  const prefix = `w${randomUUID().slice(0, 8)}:`;
  const worker = replica(prefix, { claimIdle: 0.3 });
  await worker.start();
  try {
    const fields = hopFields(prefix, 'h-slow', { lifecycle: 'after_llm_call', stage_key: 'after_llm_call', hooks: [{ skill: 'slow', method: 'linger' }] });
    fields[5] = JSON.stringify({ lifecycle: 'after_llm_call' });
    await bus.client.xadd(`${prefix}hooks:tsw`, '*', ...fields);
    await new Promise((r) => setTimeout(r, 900)); // three claim-idles into the 1.5 s hook
    const [[, , idle]] = (await bus.client.xpending(`${prefix}hooks:tsw`, 'tsw', '-', '+', 10)) as Array<[string, string, number, number]>;
    assert.ok(idle! < 300, `idle ${idle} ms: the lease was not renewed`);
    const [reply] = await replies(prefix, 1);
    assert.equal(JSON.parse(reply!.e!).outcomes[0].outcome, 'ok');
  } finally {
    await worker.stop();
  }
});

test('with HOOKBUS_SHARDS the worker reads every shard of its stream and heartbeats under the registry tag', async () => {
  const prefix = `w${randomUUID().slice(0, 8)}:`;
  const keys = new Keys(prefix, 3);
  const worker = new WorkerReplica(new GroupHost('tsw', [new Stamp()]), { redisUrl: bus.url, prefix, shards: 3, replica: 'tsw-s' });
  await worker.start();
  try {
    assert.ok(await bus.client.zscore(keys.replicas('tsw'), 'tsw-s'));
    assert.ok(await bus.client.hget(keys.registry, 'tsw'));
    const [, , third] = keys.hookStreams('tsw');
    await bus.client.xadd(third!, '*', ...hopFields(prefix, 'h-shard'));
    const [reply] = await replies(prefix, 1);
    assert.equal(JSON.parse(reply!.e!).hop_id, 'h-shard');
  } finally {
    await worker.stop();
  }
});

test('a replica killed in the middle of a hop: a sibling claims the hop and answers it', async () => {
  const prefix = `w${randomUUID().slice(0, 8)}:`;
  const bin = fileURLToPath(new URL('../bin/hookbus-worker.js', import.meta.url));
  const file = fileURLToPath(new URL('./fixtures/slow_skills.ts', import.meta.url));
  const doomed = spawn(process.execPath, [bin, '--group', 'tsw', file, '--replica', 'doomed', '--claim-idle', '0.5'], {
    env: { ...process.env, REDIS_URL: bus.url, HOOKBUS_PREFIX: prefix },
    stdio: 'ignore',
  });
  const gone = new Promise((resolve) => doomed.once('exit', resolve));
  let sibling: WorkerReplica | undefined;
  try {
    assert.ok(await waitFor(async () => (await bus.client.zscore(`${prefix}replicas:tsw`, 'doomed')) !== null, 20_000));
    await bus.client.xadd(`${prefix}hooks:tsw`, '*', ...hopFields(prefix, 'h-killed'));
    const taken = await waitFor(async () => {
      const pending = (await bus.client.xpending(`${prefix}hooks:tsw`, 'tsw', '-', '+', 10)) as Array<[string, string]>;
      return pending.some(([, consumer]) => consumer === 'doomed');
    });
    assert.ok(taken, 'the doomed replica never took the hop');
  } finally {
    doomed.kill('SIGKILL'); // a crash: nothing is cleaned up, the entry stays pending
  }
  await gone;
  try {
    sibling = replica(prefix, { claimIdle: 0.5 }); // hosts a quick `stamp.stamp`
    await sibling.start();
    const [reply] = await replies(prefix, 1);
    assert.equal(JSON.parse(reply!.e!).hop_id, 'h-killed');
    assert.equal(JSON.parse(reply!.d!).messages.at(-1).content, 'stamped on attempt 2');
  } finally {
    await sibling?.stop();
  }
});

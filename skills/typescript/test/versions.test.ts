// A replica's version as the Python worker's (hookbus.services.worker.versioning and
// drain): the flag, else HOOKBUS_WORKER_VERSION, else the skills' versions, else a hash of
// the hooks; announced in replica-versions:{group}; hops read from hooks:{group}@{version}
// too; on stop, it drains: marked draining, it serves the requests still pinned to its
// version and leaves only once none is, unless a sibling of its version serves on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Skill, hook, type HookData } from '../src/index.ts';
import { GroupHost } from '../src/worker/host.ts';
import { WorkerReplica } from '../src/worker/replica.ts';
import { hooksFingerprint, replicaVersion } from '../src/worker/versioning.ts';
import { redisForTests, waitFor } from './redis.ts';

class Tag extends Skill {
  readonly name = 'tag';

  @hook({ lifecycle: 'on_message', priority: 10 })
  async tag(data: HookData) {
    data.messages!.push({ role: 'assistant', content: 'tagged' });
  }
}

class Versioned extends Skill {
  readonly name = 'versioned';
  readonly version = '2.1.0';
}

class AlsoVersioned extends Skill {
  readonly name = 'also';
  readonly version = '7';
}

test('the version: the flag, else the environment, else the skills\' own, else h- and the hooks\' fingerprint', () => {
  const fp = hooksFingerprint(new GroupHost('g', [new Tag()]).announcement());
  assert.match(fp, /^[0-9a-f]{8}$/);
  assert.equal(replicaVersion('v3', [new Tag()], fp, { HOOKBUS_WORKER_VERSION: 'env-1' }), 'v3');
  assert.equal(replicaVersion(undefined, [new Versioned()], fp, { HOOKBUS_WORKER_VERSION: 'env-1' }), 'env-1');
  assert.equal(replicaVersion(undefined, [new Versioned()], fp, {}), '2.1.0');
  assert.equal(replicaVersion(undefined, [new Versioned(), new AlsoVersioned()], fp, {}), 'versioned-2.1.0+also-7');
  assert.equal(replicaVersion(undefined, [new Versioned(), new Tag()], fp, {}), `h-${fp}`); // not every skill declares one
  assert.throws(() => replicaVersion('no spaces', [new Tag()], fp, {}), /use 1-64 letters, digits/);
  // the same hooks in another order: the same fingerprint; another priority: another one
  const two = (priority: number) => ({
    hooks: [
      { skill: 'a', method: 'x', lifecycle: 'on_message', priority, scope: 'all', timeout: null, critical: false, guard: false, observe: false, hold_back: 0 },
      { skill: 'b', method: 'y', lifecycle: 'on_chunk', priority: 1, scope: 'all', timeout: null, critical: false, guard: false, observe: false, hold_back: 0 },
    ],
    tools: [],
  });
  assert.equal(hooksFingerprint(two(5)), hooksFingerprint({ hooks: [...two(5).hooks].reverse(), tools: [] }));
  assert.notEqual(hooksFingerprint(two(5)), hooksFingerprint(two(6)));
});

const bus = redisForTests();

function hop(prefix: string, hopId: string): string[] {
  const envelope = {
    v: 2, kind: 'hop', hop_id: hopId, completion_id: 'cmpl-v', lifecycle: 'on_message', stage_key: 'on_message',
    hooks: [{ skill: 'tag', method: 'tag' }], ctx: {}, reply_to: `${prefix}replies:orch`, deadline: Date.now() / 1000 + 30, epoch: 0, chunks: 0,
  };
  const ctx = { metadata: { completion_id: 'cmpl-v', model: 'm', agent_name: 'a' }, state: {} };
  return ['e', JSON.stringify(envelope), 'c', JSON.stringify(ctx), 'd', JSON.stringify({ lifecycle: 'on_message', messages: [] })];
}

async function answered(prefix: string, hopId: string): Promise<boolean> {
  const replies = await bus.client.xrange(`${prefix}replies:orch`, '-', '+');
  return replies.some(([, flat]) => JSON.parse(flat[1]!).hop_id === hopId);
}

function replica(prefix: string, name: string): WorkerReplica {
  return new WorkerReplica(new GroupHost('vg', [new Tag()]), { redisUrl: bus.url, prefix, replica: name, claimIdle: 1, version: 'v9', drainSeconds: 20 });
}

test('a replica announces its version, reads its version\'s stream, and drains: it serves the pinned requests before it leaves', async () => {
  const prefix = `v${randomUUID().slice(0, 8)}:`;
  const worker = replica(prefix, 'vg-1');
  await worker.start();
  const info = async () => {
    const raw = await bus.client.hget(`${prefix}replica-versions:vg`, 'vg-1');
    return raw === null ? null : JSON.parse(raw);
  };
  assert.deepEqual({ ...(await info()), started: undefined }, { version: 'v9', hooks: worker.hooksFingerprint, draining: false, started: undefined });
  await bus.client.xadd(`${prefix}hooks:vg@v9`, '*', ...hop(prefix, 'h-pinned'));
  assert.ok(await waitFor(() => answered(prefix, 'h-pinned')), 'a hop on the version\'s stream was not answered');

  await bus.client.zadd(`${prefix}serving:vg@v9`, Date.now() / 1000, 'cmpl-still-running'); // pinned, not yet ended
  let stopped = false;
  const stopping = worker.stop().then(() => (stopped = true));
  assert.ok(await waitFor(async () => (await info())?.draining === true), 'not marked draining');
  await bus.client.xadd(`${prefix}hooks:vg@v9`, '*', ...hop(prefix, 'h-while-draining'));
  assert.ok(await waitFor(() => answered(prefix, 'h-while-draining')), 'a pinned request\'s hop was not served while draining');
  assert.equal(stopped, false);
  assert.equal(Number(await bus.client.zscore(`${prefix}replicas:vg`, 'vg-1')) > 0, true); // still heartbeating
  await bus.client.zrem(`${prefix}serving:vg@v9`, 'cmpl-still-running'); // the request ended
  await stopping;
  assert.equal(await info(), null); // gone from replica-versions with its heartbeat
  assert.equal(await bus.client.zscore(`${prefix}replicas:vg`, 'vg-1'), null);
});

test('a draining replica whose sibling of the same version serves on stops reading at once', async () => {
  const prefix = `v${randomUUID().slice(0, 8)}:`;
  const first = replica(prefix, 'vg-1');
  const second = replica(prefix, 'vg-2');
  await first.start();
  await second.start();
  try {
    await bus.client.zadd(`${prefix}serving:vg@v9`, Date.now() / 1000, 'cmpl-still-running');
    const began = performance.now();
    await first.stop();
    assert.ok(performance.now() - began < 5000, `took ${performance.now() - began} ms`);
    await bus.client.xadd(`${prefix}hooks:vg@v9`, '*', ...hop(prefix, 'h-sibling'));
    assert.ok(await waitFor(() => answered(prefix, 'h-sibling')), 'the sibling did not serve the version');
  } finally {
    await bus.client.del(`${prefix}serving:vg@v9`);
    await second.stop();
  }
});

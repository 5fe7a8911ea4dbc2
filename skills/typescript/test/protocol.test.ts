// The constants the TypeScript worker shares with the Python one come from the protocol
// spec (services/protocol/spec/protocol.json, read by scripts/protocol.mjs at build time):
// the key names it builds are the spec's, the version rule refuses what the spec refuses,
// the reply size limits read the spec's variables and say what the Python worker says.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Keys } from '../src/bus/keys.ts';
import { checkVersion } from '../src/bus/versions.ts';
import { PIN_SETTLE } from '../src/worker/drain.ts';
import { hopLimits, overHopLimits } from '../src/worker/limits.ts';
import { CONSTANTS, PROTOCOL } from '../src/generated/protocol.ts';

const spec = JSON.parse(readFileSync(new URL('../../../services/protocol/spec/protocol.json', import.meta.url), 'utf8'));

test('the generated constants are the committed spec\'s', () => {
  assert.equal(PROTOCOL, spec.protocol);
  assert.deepEqual(JSON.parse(JSON.stringify(CONSTANTS)), spec.constants);
  assert.equal(PIN_SETTLE, spec.constants.timings.drain_pin_settle);
});

test('every key a worker touches is named as the spec names it, plain and on a Cluster', () => {
  for (const [layout, cluster] of [['plain', false], ['cluster', true]] as const) {
    const keys = new Keys('<prefix>:', 1, cluster);
    const built: Record<string, string> = {
      hooks: keys.hooksShard('<group>', 0),
      pinned_hooks: keys.pinnedHookStreams('<group>', '<version>')[0]!,
      observe: keys.observeShard('<group>', 0),
      events: keys.eventsFor('<completion_id>'),
      dead_letter: keys.deadLetter,
      registry: keys.registry,
      registry_version: keys.registryVersion,
      replicas: keys.replicas('<group>'),
      replica_heartbeat: keys.replicaHeartbeat('<group>', '<replica>'),
      replica_versions: keys.replicaVersions('<group>'),
      serving: keys.serving('<group>', '<version>'),
    };
    assert.deepEqual(built, spec.constants.keys[layout], layout);
  }
});

test('a version is the whole text the spec\'s rule allows: a trailing newline is refused, not trimmed', () => {
  for (const good of ['2.5.0', 'v2', 'a+b-1_c', 'x'.repeat(64)]) assert.equal(checkVersion(good), good);
  for (const bad of ['v2\n', ' v2', '-v2', '', 'x'.repeat(65), 'v/2']) {
    assert.throws(() => checkVersion(bad), (e: Error) => e instanceof RangeError && e.message.includes(spec.constants.version.rule), JSON.stringify(bad));
  }
});

test('the reply size limits: the spec\'s variables and defaults, the Python worker\'s words', () => {
  assert.deepEqual(hopLimits({}), { maxHopBytes: spec.constants.limits.max_hop_bytes.default, maxStateBytes: spec.constants.limits.max_state_bytes.default });
  const limits = hopLimits({ HOOKBUS_MAX_HOP_BYTES: '2000', HOOKBUS_MAX_STATE_BYTES: '1000' });
  assert.deepEqual(limits, { maxHopBytes: 2000, maxStateBytes: 1000 });
  assert.throws(() => hopLimits({ HOOKBUS_MAX_HOP_BYTES: '-1' }), /HOOKBUS_MAX_HOP_BYTES/);
  assert.equal(overHopLimits(['e', 'x'.repeat(900)], { a: 1 }, limits), undefined);
  const state = { blob: 's'.repeat(1500) };
  assert.equal(
    overHopLimits(['e', JSON.stringify({ state })], state, limits),
    'ctx.state is 1,511 bytes as JSON, over its limit of 1,000 (HOOKBUS_MAX_STATE_BYTES): keep large data elsewhere and put a key in the state',
  );
  assert.equal(
    overHopLimits(['e', '{}', 'd', 'é'.repeat(1200)], {}, limits),
    "the hooks' results are 2,402 bytes, over a hop's limit of 2,000 (HOOKBUS_MAX_HOP_BYTES)",
  );
});

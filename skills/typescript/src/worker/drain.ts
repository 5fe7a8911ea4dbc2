/**
 * How long a replica told to stop (SIGTERM) keeps serving (hookbus.services.worker.drain).
 * It marks itself draining at once, so orchestrators pin no new request to its version
 * while another version takes them. Then:
 *
 * - a sibling of its version that is not draining lives: it stops reading at once (the
 *   sibling serves the requests pinned to the version);
 * - it is the last replica of its version that is not draining: it keeps serving the hops
 *   of the requests already pinned to its version until none is left (`serving:` count
 *   zero), so that no request changes version mid-way; when another version takes new
 *   requests, it first waits PIN_SETTLE seconds, the time every orchestrator needs to see
 *   it draining (a registry refresh).
 *
 * Either way it waits at most `limit` seconds.
 */

import type { Redis } from 'ioredis';
import type { Keys } from '../bus/keys.js';
import { sleep } from '../bus/member.js';
import { liveVersions, servingCount } from '../bus/versions.js';
import { log } from '../log.js';
import { CONSTANTS } from '../generated/protocol.js';

/** Two registry refreshes of an orchestrator, a publication of its `serving:` counts and a
 * margin: the spec's `drain_pin_settle` (docs/rollouts.md). */
export const PIN_SETTLE = CONSTANTS.timings.drain_pin_settle;
const POLL_EVERY_MS = 100;

/** Return once this replica may stop reading (see the module docstring). A sibling counts
 * as serving on only with a heartbeat in the last `aliveWithin` seconds. */
export async function servePinnedRequests(
  client: Redis, keys: Keys, group: string, replica: string, version: string, limit: number, aliveWithin: number,
): Promise<void> {
  const began = performance.now();
  const waited = (): number => (performance.now() - began) / 1000;
  while (waited() < limit) {
    const states = await liveVersions(client, keys, group, aliveWithin);
    const mine = states.get(version);
    if (mine?.replicas.some((r) => r !== replica && !mine.draining.includes(r))) {
      log('drain_sibling_serves', { group, version, replica }, 'info');
      return;
    }
    const othersOpen = [...states].some(([v, s]) => v !== version && s.takesNewRequests);
    const settled = !othersOpen || waited() >= PIN_SETTLE;
    if (settled && (await servingCount(client, keys, group, version)) === 0) {
      log('drain_version_done', { group, version, replica, waited_s: Math.round(waited() * 100) / 100 }, 'info');
      return;
    }
    await sleep(POLL_EVERY_MS);
  }
  log('drain_limit_reached', { group, version, replica, limit_s: limit });
}

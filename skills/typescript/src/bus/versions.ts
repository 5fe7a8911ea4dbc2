/**
 * Which version each replica of a group runs (hookbus.bus.groups.versions): a replica
 * writes its ReplicaInfo under its name in `replica-versions:{group}` next to its
 * heartbeat and reads, beside `hooks:{group}`, the stream of its version
 * `hooks:{group}@{version}`, where orchestrators send the hops of the requests they pinned
 * to that version. `serving:{group}@{version}` counts the requests pinned to a version and
 * not yet ended: what the last replica of a version waits for when it drains.
 */

import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import { CONSTANTS } from '../generated/protocol.js';

/** Seconds after which a pin still counted in `serving:` (its orchestrator died) no longer counts. */
const PIN_STALE = CONSTANTS.timings.pin_stale;
const VERSION = new RegExp(CONSTANTS.version.pattern);

/** `version` if it can name a stream (`hooks:{group}@{version}`), else a RangeError. */
export function checkVersion(version: string): string {
  if (!VERSION.test(version)) {
    throw new RangeError(
      `version ${JSON.stringify(version)}: use ${CONSTANTS.version.rule}`,
    );
  }
  return version;
}

/** What one replica says about itself in `replica-versions:{group}` (the Python model's fields). */
export interface ReplicaInfo {
  version: string;
  /** Fingerprint of the hooks' set and priorities (and the tools) it serves. */
  hooks: string;
  /** Told to stop: no new request is pinned to it. */
  draining: boolean;
  started: number;
}

export async function publish(client: Redis, keys: Keys, group: string, replica: string, info: ReplicaInfo): Promise<void> {
  await client.hset(keys.replicaVersions(group), replica, JSON.stringify(info));
}

/** Every readable ReplicaInfo of the group, by replica (live or not). */
export async function replicaInfos(client: Redis, keys: Keys, group: string): Promise<Map<string, ReplicaInfo>> {
  const raw = await client.hgetall(keys.replicaVersions(group));
  const infos = new Map<string, ReplicaInfo>();
  for (const [replica, body] of Object.entries(raw)) {
    try {
      const info = JSON.parse(body) as ReplicaInfo;
      if (typeof info.version === 'string') infos.set(replica, info);
    } catch {
      // a replica without a readable info runs no version
    }
  }
  return infos;
}

/** One version of the group as its live replicas show it. */
export interface VersionState {
  replicas: string[];
  draining: string[];
  takesNewRequests: boolean;
}

/** The versions of the group's replicas with a heartbeat in the last `aliveWithin` seconds. */
export async function liveVersions(client: Redis, keys: Keys, group: string, aliveWithin: number): Promise<Map<string, VersionState>> {
  const live = await client.zrangebyscore(keys.replicas(group), Date.now() / 1000 - aliveWithin, '+inf');
  const infos = await replicaInfos(client, keys, group);
  const states = new Map<string, VersionState>();
  for (const replica of live) {
    const info = infos.get(replica);
    if (!info) continue;
    const state = states.get(info.version) ?? { replicas: [], draining: [], takesNewRequests: false };
    state.replicas.push(replica);
    if (info.draining) state.draining.push(replica);
    else state.takesNewRequests = true;
    states.set(info.version, state);
  }
  return states;
}

/** How many requests are pinned to `version` of the group and not yet ended. */
export async function servingCount(client: Redis, keys: Keys, group: string, version: string): Promise<number> {
  return Number(await client.zcount(keys.serving(group, version), Date.now() / 1000 - PIN_STALE, '+inf'));
}

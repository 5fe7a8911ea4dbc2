/**
 * Announcing a group and heartbeating a replica, as hookbus.bus.groups.registry does: the
 * group's descriptors and its protocol version are a field of the registry hash (the
 * registry version is bumped only when they changed); each beat is the replica's score
 * (unix seconds) in the group's replicas sorted set, which orchestrators count as live for
 * REPLICA_TTL seconds, and beside it a heartbeat record naming the protocol the replica
 * speaks, expiring REPLICA_TTL seconds later (the protocol revision of issue 32: a Python
 * build without it only sees one more key, which expires).
 */

import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import type { GroupAnnouncement } from '../worker/host.js';

import { CONSTANTS, PROTOCOL } from '../generated/protocol.js';

export const HEARTBEAT_EVERY = CONSTANTS.timings.heartbeat_every;
export const REPLICA_TTL = CONSTANTS.timings.replica_ttl;

/** What the fingerprint of hookbus.bus.groups.registry covers: the group, hooks, tools. */
function sameDescriptors(a: Partial<GroupAnnouncement>, b: GroupAnnouncement): boolean {
  const pick = (x: Partial<GroupAnnouncement>) => JSON.stringify([x.group, x.hooks ?? [], x.tools ?? []]);
  return pick(a) === pick(b);
}

/** Publish the group's descriptors; returns whether the registry changed. */
export async function announce(client: Redis, keys: Keys, announcement: GroupAnnouncement, warn: (event: string, fields: object) => void): Promise<boolean> {
  const existingRaw = await client.hget(keys.registry, announcement.group);
  let current = announcement;
  if (existingRaw) {
    try {
      const existing = JSON.parse(existingRaw) as GroupAnnouncement;
      // the same descriptors under another protocol version are a change: orchestrators read it
      if (sameDescriptors(existing, announcement) && existing.protocol === announcement.protocol) return false;
      warn('group_announcement_changed', {
        group: announcement.group,
        hint: 'every replica of a group must host the same skills; the last announcement wins',
      });
      if (typeof existing.first_seen === 'number') current = { ...announcement, first_seen: existing.first_seen };
    } catch {
      // an unreadable announcement is replaced
    }
  }
  await client.multi().hset(keys.registry, announcement.group, JSON.stringify(current)).incr(keys.registryVersion).exec();
  return true;
}

export function heartbeatEvery(claimIdle: number, fallback = HEARTBEAT_EVERY): number {
  return Math.max(CONSTANTS.timings.heartbeat_min, Math.min(fallback, claimIdle / 4));
}

/** One beat, in one round trip: the score that says the replica lives, and its record. */
export async function heartbeat(client: Redis, keys: Keys, group: string, replica: string): Promise<void> {
  const ts = Date.now() / 1000;
  const record = { v: 1, kind: 'heartbeat', group, replica, protocol: PROTOCOL, ts };
  const results = await client
    .pipeline()
    .zadd(keys.replicas(group), ts, replica)
    .set(keys.replicaHeartbeat(group, replica), JSON.stringify(record), 'EX', REPLICA_TTL)
    .exec();
  const failed = results?.find(([error]) => error);
  if (failed) throw failed[0];
}

/** Gone from the group at once, in one round trip: no heartbeat, no record, no version. */
export async function leave(client: Redis, keys: Keys, group: string, replica: string): Promise<void> {
  await client
    .pipeline()
    .zrem(keys.replicas(group), replica)
    .del(keys.replicaHeartbeat(group, replica))
    .hdel(keys.replicaVersions(group), replica)
    .exec();
}

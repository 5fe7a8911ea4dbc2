/**
 * Announcing a group and heartbeating a replica, as hookbus.bus.registry does: the group's
 * descriptors are a field of the registry hash (the registry version is bumped only when
 * they changed), each replica's heartbeat is its score (unix seconds) in the group's
 * replicas sorted set, which orchestrators count as live for REPLICA_TTL seconds.
 */

import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import type { GroupAnnouncement } from '../worker/host.js';

export const HEARTBEAT_EVERY = 2.0;

/** What the fingerprint of hookbus.bus.registry covers: the group, hooks, tools, compaction. */
function sameDescriptors(a: Partial<GroupAnnouncement>, b: GroupAnnouncement): boolean {
  const pick = (x: Partial<GroupAnnouncement>) => JSON.stringify([x.group, x.hooks ?? [], x.tools ?? [], x.compaction ?? []]);
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
  return Math.max(0.05, Math.min(fallback, claimIdle / 4));
}

export async function heartbeat(client: Redis, keys: Keys, group: string, replica: string): Promise<void> {
  await client.zadd(keys.replicas(group), Date.now() / 1000, replica);
}

export async function leave(client: Redis, keys: Keys, group: string, replica: string): Promise<void> {
  await client.zrem(keys.replicas(group), replica);
}

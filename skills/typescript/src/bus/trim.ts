/**
 * Keeping the group's stream bounded without losing an unacknowledged entry
 * (hookbus.bus.groups.trim): one Lua script trims up to the oldest entry some consumer
 * group still needs, atomically; consumers gone for long that hold nothing are forgotten.
 * Both scripts come from the protocol spec, the Python worker's own text.
 */

import type { Redis } from 'ioredis';
import { CONSTANTS } from '../generated/protocol.js';

export const TRIM_EVERY = CONSTANTS.timings.trim_every;
const FORGET_AFTER = CONSTANTS.timings.forget_after;

/** The scripts every worker runs as they are (the spec's `constants.scripts`). */
const TRIM = CONSTANTS.scripts.trim_acked;
const PRUNE = CONSTANTS.scripts.prune_consumers;

export async function trimAcked(client: Redis, stream: string): Promise<number> {
  const [removed] = (await client.eval(TRIM, 1, stream)) as [number, string];
  return Number(removed);
}

export async function pruneConsumers(client: Redis, stream: string, group: string, heartbeats: string): Promise<number> {
  let consumers: unknown[];
  try {
    consumers = (await client.xinfo('CONSUMERS', stream, group)) as unknown[];
  } catch {
    return 0; // no such stream or group yet
  }
  const names = consumers.map((c) => {
    const flat = c as string[];
    return String(flat[flat.indexOf('name') + 1]);
  });
  if (!names.length) return 0;
  const scores = (await client.call('ZMSCORE', heartbeats, ...names)) as Array<string | null>;
  const cutoff = Date.now() / 1000 - FORGET_AFTER;
  const gone = names.filter((_, i) => scores[i] === null || Number(scores[i]) < cutoff);
  let removed = 0;
  if (gone.length) removed = Number(await client.eval(PRUNE, 1, stream, group, ...gone));
  await client.zremrangebyscore(heartbeats, '-inf', cutoff);
  return removed;
}

/** XGROUP DELCONSUMER `consumer`, atomically only if it holds no pending entry (a replica
 * leaving after its drain: nothing of it is left for a lease to expire). */
export async function deleteConsumerIfIdle(client: Redis, stream: string, group: string, consumer: string): Promise<boolean> {
  try {
    return Number(await client.eval(PRUNE, 1, stream, group, consumer)) === 1;
  } catch {
    return false; // no such stream or group
  }
}

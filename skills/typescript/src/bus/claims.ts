/**
 * Which pending entries of the group this replica takes over, and taking them
 * (hookbus.bus.claims): an entry idle at least `claimIdle` seconds is an orphan when its
 * consumer has no heartbeat in the last `claimIdle` seconds, or it is this replica's own
 * and this replica is not running it (delivered before it started, or while it had room),
 * or it has been idle longer than `longIdle` whoever holds it. XCLAIM with a min-idle time
 * is atomic, so two claimers never both get an entry.
 */

import type { Redis } from 'ioredis';
import { CONSTANTS } from '../generated/protocol.js';

const MIN_LONG_IDLE = CONSTANTS.timings.min_long_idle;
const RETRY_CAP = CONSTANTS.timings.retry_cap;

export interface Orphan {
  entryId: string;
  consumer: string;
  deliveries: number;
}

export interface Claimed {
  stream: string;
  entryId: string;
  fields: Record<string, string>;
  /** This delivery's number, counting from 1. */
  attempt: number;
  previousOwner: string;
}

export interface Workload {
  busy: ReadonlySet<string>;
  spare: boolean;
  uptimeSeconds: number;
}

/** Since when this process reached Redis without trouble: claim only when steady, so a
 * Redis outage (every heartbeat old) does not make live siblings look dead. */
export class Steadiness {
  readonly every: number;
  readonly slowAfter: number;
  readonly grace: number;
  private since = performance.now();
  private lastOk = performance.now();

  constructor(claimIdle: number, every: number) {
    this.every = every;
    this.slowAfter = Math.max(0.5, claimIdle / 4);
    this.grace = claimIdle + RETRY_CAP + every;
  }

  started(): void {
    this.since = this.lastOk = performance.now();
  }

  trouble(): void {
    this.since = performance.now();
  }

  heartbeatOk(started: number): void {
    const now = performance.now();
    if ((now - started) / 1000 > this.slowAfter || (now - this.lastOk) / 1000 > 2 * this.every + this.slowAfter) this.since = now;
    this.lastOk = now;
  }

  steady(): boolean {
    const now = performance.now();
    if ((now - this.lastOk) / 1000 > 2 * this.every + this.slowAfter) return false;
    return (now - this.since) / 1000 >= this.grace;
  }
}

export async function findOrphans(
  client: Redis, stream: string, group: string, me: string, heartbeats: string, claimIdle: number, count: number, now: Workload,
): Promise<Orphan[]> {
  const idleMs = Math.floor(claimIdle * 1000);
  const pending = (await client.xpending(stream, group, 'IDLE', idleMs, '-', '+', count)) as Array<[string, string, number, number]>;
  if (!pending.length) return [];
  const longMs = Math.max(MIN_LONG_IDLE, 10 * claimIdle) * 1000;
  const others = [...new Set(pending.map((p) => p[1]))].filter((c) => c !== me).sort();
  const scores = others.length ? ((await client.call('ZMSCORE', heartbeats, ...others)) as Array<string | null>) : [];
  const wall = Date.now() / 1000;
  const alive = new Set(others.filter((_, i) => scores[i] !== null && wall - Number(scores[i]) < claimIdle));
  const uptimeMs = now.uptimeSeconds * 1000;
  const orphans: Orphan[] = [];
  for (const [entryId, consumer, idle, deliveries] of pending) {
    if (now.busy.has(`${stream} ${entryId}`)) continue;
    const orphan = consumer === me ? now.spare || idle > uptimeMs || idle > longMs : !alive.has(consumer) || idle > longMs;
    if (orphan) orphans.push({ entryId, consumer, deliveries: Number(deliveries) });
  }
  return orphans;
}

export async function claim(client: Redis, stream: string, group: string, me: string, claimIdle: number, orphans: Orphan[]): Promise<Claimed[]> {
  if (!orphans.length) return [];
  const byId = new Map(orphans.map((o) => [o.entryId, o]));
  const entries = (await client.xclaim(stream, group, me, Math.floor(claimIdle * 1000), ...byId.keys())) as Array<[string, string[] | null] | null>;
  const claimed: Claimed[] = [];
  for (const entry of entries) {
    if (!entry || !entry[1]) continue; // deleted from the stream while pending: nothing to run
    const orphan = byId.get(entry[0]);
    if (!orphan) continue;
    claimed.push({ stream, entryId: entry[0], fields: pairs(entry[1]), attempt: orphan.deliveries + 1, previousOwner: orphan.consumer });
  }
  return claimed;
}

export function pairs(flat: readonly string[]): Record<string, string> {
  const fields: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) fields[flat[i]!] = flat[i + 1]!;
  return fields;
}

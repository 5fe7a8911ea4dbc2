/**
 * One replica's membership of a consumer group on some streams (hookbus.bus.groups.member):
 * what the hook half of a replica (`hooks:{group}` and its version's stream) and its
 * observer half (`observe:{group}`) share, each with its own member and its own reader
 * connection, so a backlog of observations never delays a hop:
 *
 * - an XREADGROUP loop over every stream that reads as many entries as there are free
 *   slots (`concurrency` bounds prefetch + in flight exactly), optionally lingering after
 *   a read that delivered, so that one read takes everything that came meanwhile;
 * - claims of the entries a dead sibling left pending (only while this process reaches
 *   Redis steadily), lease renewal (XCLAIM JUSTID) of the running entries every
 *   `claimIdle / 3`, a janitor that trims the streams up to what every group acked;
 * - optionally the replica's heartbeat (`beat`), whose success is what makes it steady.
 *
 * `run` gets each entry, read (attempt 1) or claimed (its delivery number): it decides
 * what to do with it (answer, dead-letter, ack); what it throws is logged and leaves the
 * entry pending, for a claim to run it again.
 */

import type { Redis } from 'ioredis';
import { connect } from './connection.js';
import { claim, findOrphans, pairs, type Steadiness } from './claims.js';
import { pruneConsumers, trimAcked } from './trim.js';
import { log } from '../log.js';

export interface Entry {
  stream: string;
  entryId: string;
  fields: Record<string, string>;
  /** This delivery's number, counting from 1. */
  attempt: number;
}

export interface MemberOptions {
  redisUrl: string;
  /** A Redis Cluster: each stream (its own slot) is read by a connection and a loop of its own. */
  cluster?: boolean;
  client: Redis;
  streams: string[];
  group: string;
  replica: string;
  /** The group's heartbeat sorted set (who is alive to hold an entry). */
  heartbeats: string;
  concurrency: number;
  claimIdle: number;
  trimEvery: number;
  steadiness: Steadiness;
  run: (entry: Entry) => Promise<void>;
  /** What this member's entries are, in its log lines (`hop`, `observations`). */
  label: string;
  /** Seconds to wait after a read that delivered entries. */
  linger?: number;
  /** The replica's heartbeat, every `beatEvery` seconds. */
  beat?: () => Promise<void>;
  beatEvery?: number;
}

const READ_BLOCK_MS = 1000;

export class GroupMember {
  readonly inFlight = new Map<string, { stream: string; entryId: string }>();
  readonly tasks = new Set<Promise<void>>();
  claimed = 0;
  /** Reads that delivered entries. */
  deliveries = 0;

  /** Blocking reads, each on its connection: one for every stream on a single Redis, one per stream on a Cluster. */
  private readonly readers: Array<{ client: Redis; streams: string[] }>;
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private stopping = false;
  private startedAt = performance.now();
  /** Resume the read loops waiting for a free slot. */
  private waiting: Array<() => void> = [];
  /** Ends the read loop's linger early (the member stops). */
  private endPause: (() => void) | undefined;
  private readLoopsDone: Promise<unknown> | undefined;

  constructor(private readonly o: MemberOptions) {
    const groups = o.cluster ? o.streams.map((stream) => [stream]) : [o.streams];
    this.readers = groups.map((streams) => {
      const client = connect(o.redisUrl, `${o.replica}-${o.label}-reader`, o.cluster ?? false);
      client.on('error', (e: Error) => log('redis_error', { connection: `${o.label} reader`, error: e.message }));
      return { client, streams };
    });
  }

  get streams(): readonly string[] {
    return this.o.streams;
  }

  /** Create the consumer group on every stream at its start, so no entry written before is missed. */
  async ensureGroups(): Promise<void> {
    for (const stream of this.o.streams) {
      try {
        await this.o.client.xgroup('CREATE', stream, this.o.group, '0', 'MKSTREAM');
      } catch (exc) {
        if (!String((exc as Error).message).includes('BUSYGROUP')) throw exc;
      }
    }
  }

  start(): void {
    this.startedAt = performance.now();
    if (this.o.beat) {
      const beat = this.o.beat;
      this.repeat('heartbeat', this.o.beatEvery ?? 2, async () => {
        const began = performance.now();
        await beat();
        this.o.steadiness.heartbeatOk(began);
      });
    }
    this.repeat('claim', this.o.claimIdle / 2, () => this.claimOnce());
    this.repeat('lease', this.o.claimIdle / 3, () => this.renewLeases());
    this.repeat('janitor', this.o.trimEvery, () => this.janitorOnce());
    this.readLoopsDone = Promise.all(this.readers.map((reader) => this.readLoop(reader.client, reader.streams)));
  }

  /** Read and claim nothing more (what was not read stays for the siblings). */
  async stopReading(): Promise<void> {
    if (!this.stopping) {
      this.stopping = true;
      this.wakeReaders();
      this.endPause?.();
      for (const reader of this.readers) reader.client.disconnect();
    }
    await this.readLoopsDone;
    this.stop('claim', 'janitor');
  }

  /** Stop the named background jobs (all of them without a name). */
  stop(...names: string[]): void {
    for (const name of names.length ? names : [...this.timers.keys()]) {
      clearTimeout(this.timers.get(name));
      this.timers.delete(name);
    }
  }

  /** Wait until the entries running finish, `seconds` at most; false if some did not. */
  async finish(seconds: number): Promise<boolean> {
    if (!this.tasks.size) return true;
    let timer: NodeJS.Timeout | undefined;
    const done = await Promise.race([
      Promise.allSettled([...this.tasks]).then(() => true),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), seconds * 1000))),
    ]);
    clearTimeout(timer);
    return done;
  }

  private async readLoop(reader: Redis, streams: string[]): Promise<void> {
    const { group, replica } = this.o;
    const share = this.readers.length;
    let backoff = 50;
    while (!this.stopping) {
      const free = this.o.concurrency - this.inFlight.size;
      if (free <= 0) {
        await new Promise<void>((resolve) => this.waiting.push(resolve));
        continue;
      }
      let result: Array<[string, Array<[string, string[]]>]> | null;
      try {
        result = (await reader.xreadgroup(
          'GROUP', group, replica, 'COUNT', Math.ceil(free / share), 'BLOCK', READ_BLOCK_MS,
          'STREAMS', ...streams, ...streams.map(() => '>'),
        )) as typeof result;
        backoff = 50;
      } catch (exc) {
        if (this.stopping) break;
        const message = (exc as Error).message;
        log('read_failed', { stream: streams[0], error: message });
        this.o.steadiness.trouble();
        if (message.includes('NOGROUP')) await this.ensureGroups().catch(() => undefined);
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 1000);
        continue;
      }
      if (!result?.length) continue;
      this.deliveries++;
      for (const [stream, entries] of result) {
        for (const [entryId, flat] of entries) this.deliver({ stream, entryId, fields: pairs(flat), attempt: 1 });
      }
      if (this.o.linger) await this.pause(this.o.linger);
    }
  }

  /** Resume the read loops waiting for a free slot. */
  private wakeReaders(): void {
    const waiting = this.waiting;
    this.waiting = [];
    for (const resume of waiting) resume();
  }

  /** Sleep `seconds`, cut short when the member stops. */
  private async pause(seconds: number): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, seconds * 1000);
      this.endPause = () => {
        clearTimeout(timer);
        resolve();
      };
    });
    this.endPause = undefined;
  }

  private deliver(entry: Entry): void {
    const key = `${entry.stream} ${entry.entryId}`;
    this.inFlight.set(key, { stream: entry.stream, entryId: entry.entryId });
    const task: Promise<void> = this.o.run(entry)
      .catch((exc) => log(`${this.o.label}_failed`, { entry_id: entry.entryId, error: String((exc as Error)?.message ?? exc) }))
      .finally(() => {
        this.inFlight.delete(key);
        this.tasks.delete(task);
        this.wakeReaders();
      });
    this.tasks.add(task);
  }

  private repeat(name: string, everySeconds: number, job: () => Promise<unknown>): void {
    const tick = async (): Promise<void> => {
      try {
        await job();
      } catch (exc) {
        if (!this.stopping || name === 'lease') log(`${name}_failed`, { error: (exc as Error).message });
        this.o.steadiness.trouble();
      }
      if (this.timers.has(name)) this.timers.set(name, setTimeout(tick, everySeconds * 1000));
    };
    this.timers.set(name, setTimeout(tick, everySeconds * 1000));
  }

  /** One claim pass over every stream: the orphans, as many as there is room for. */
  async claimOnce(): Promise<number> {
    if (this.stopping || !this.o.steadiness.steady()) return 0;
    const { client, group, replica, claimIdle, concurrency } = this.o;
    let taken = 0;
    for (const stream of this.o.streams) {
      const busy = new Set(this.inFlight.keys());
      const room = concurrency - busy.size;
      const orphans = await findOrphans(
        client, stream, group, replica, this.o.heartbeats, claimIdle, Math.max(100, concurrency * 4),
        { busy, spare: room > 0, uptimeSeconds: (performance.now() - this.startedAt) / 1000 },
      );
      if (!orphans.length || room <= 0 || !this.o.steadiness.steady()) continue;
      const claimed = await claim(client, stream, group, replica, claimIdle, orphans.slice(0, room));
      this.claimed += claimed.length; // counted before they run: a reply can come before the other streams' pass ends
      for (const entry of claimed) {
        log('claimed', { stream, entry_id: entry.entryId, attempt: entry.attempt, replica, previous_owner: entry.previousOwner }, 'info');
        this.deliver(entry);
      }
      taken += claimed.length;
    }
    return taken;
  }

  /** Keep the claims on running entries fresh so siblings do not take them. */
  private async renewLeases(): Promise<void> {
    const byStream = new Map<string, string[]>();
    for (const { stream, entryId } of this.inFlight.values()) byStream.set(stream, [...(byStream.get(stream) ?? []), entryId]);
    for (const [stream, ids] of byStream) {
      await this.o.client.xclaim(stream, this.o.group, this.o.replica, 0, ...ids, 'JUSTID');
    }
  }

  async janitorOnce(): Promise<number> {
    let removed = 0;
    for (const stream of this.o.streams) {
      removed += await trimAcked(this.o.client, stream);
      await pruneConsumers(this.o.client, stream, this.o.group, this.o.heartbeats);
    }
    return removed;
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

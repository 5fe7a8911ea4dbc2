/**
 * A replica's observers (hookbus.services.worker.observer, in TypeScript): it consumes its
 * group's observer stream `observe:{group}` (../wire/observations.ts) and runs the observer
 * hooks of each entry. Nobody waits for an answer: there is no reply, only the ack.
 *
 * The stream is its own consumer group `{group}`, with its own reader, claims, leases and
 * janitor (../bus/member.ts), apart from the hook stream, so a backlog of observations never
 * delays a hop of the same group's blocking hooks:
 *
 * - an entry is one request's stages, run in order by one replica (that is what keeps a
 *   request's observations in order); several entries (requests) run at once, up to
 *   `concurrency`;
 * - the reader lingers LINGER seconds after a read that delivered entries, so one
 *   XREADGROUP takes every request that ended meanwhile;
 * - ack after the run: a replica killed mid-entry leaves it pending, a sibling claims it
 *   once the killed one's heartbeat is `claimIdle` old and runs the whole entry again
 *   (at least once: observers see `ctx.call.attempt` > 1 then); the acks of entries
 *   finished within ACK_DELAY of each other go in one XACK;
 * - an entry that cannot be decoded, or that was delivered more than `maxDeliveries`
 *   times, goes to the dead-letter stream.
 *
 * Each observer's outcomes are recorded on the events stream as `observe` records, one per
 * lifecycle of an entry (a failing observer: its first error).
 */

import type { Redis } from 'ioredis';
import { Context } from '../context.js';
import { setAside } from '../bus/deadLetters.js';
import { outcomesRecord, type EventWriter } from '../bus/events.js';
import type { Keys } from '../bus/keys.js';
import { GroupMember, type Entry } from '../bus/member.js';
import type { Steadiness } from '../bus/claims.js';
import { ObserverMemory, observeStage } from '../observing.js';
import type { HookOutcome } from '../runner.js';
import { DecodeError } from '../wire/envelopes.js';
import { decodeObservations, stagesSeen, type ObservationBatch } from '../wire/observations.js';
import type { GroupHost } from './host.js';
import { log } from '../log.js';

const ACK_DELAY_MS = 50;
/** Seconds between two reads of the observer stream that deliver (see the module docstring). */
const LINGER = 0.5;

export interface ObserverOptions {
  redisUrl: string;
  client: Redis;
  keys: Keys;
  replica: string;
  events: EventWriter;
  concurrency: number;
  claimIdle: number;
  maxDeliveries: number;
  trimEvery: number;
  /** The replica's own: its heartbeat says whether this process reaches Redis steadily
   * enough to claim (the observer half has no heartbeat of its own). */
  steadiness: Steadiness;
}

export class ObserverConsumer {
  readonly group: string;
  readonly member: GroupMember;
  /** Entries run to their end (each one request's stages). */
  observed = 0;
  deadLettered = 0;
  /** XACK commands sent (each acks every entry finished since the one before). */
  acks = 0;

  private owed = new Map<string, string[]>();
  private ackTimer: NodeJS.Timeout | undefined;

  constructor(readonly host: GroupHost, private readonly o: ObserverOptions) {
    this.group = host.group;
    this.member = new GroupMember({
      redisUrl: o.redisUrl, cluster: o.keys.cluster, client: o.client, streams: o.keys.observeStreams(this.group), group: this.group,
      replica: o.replica, heartbeats: o.keys.replicas(this.group), concurrency: o.concurrency, claimIdle: o.claimIdle,
      trimEvery: o.trimEvery, steadiness: o.steadiness, run: (entry) => this.run(entry), label: 'observations',
      linger: LINGER,
    });
  }

  async start(): Promise<void> {
    await this.member.ensureGroups();
    this.member.start();
  }

  /** Read and claim nothing more (a stopping replica: what it has not read stays for its siblings). */
  stopReading(): Promise<void> {
    return this.member.stopReading();
  }

  /** After `stopReading`: let running entries finish (up to `drain` s), send the acks owed. */
  async stop(drain: number): Promise<void> {
    await this.member.finish(drain);
    this.member.stop();
    await this.flushAcks();
  }

  private async run(entry: Entry): Promise<void> {
    if (entry.attempt > this.o.maxDeliveries) {
      return this.deadLetter(entry, `delivered ${entry.attempt} times without being acked`);
    }
    let batch: ObservationBatch;
    try {
      batch = decodeObservations(entry.fields);
    } catch (exc) {
      if (!(exc instanceof DecodeError)) throw exc;
      return this.deadLetter(entry, exc.message);
    }
    await this.observe(batch, entry.attempt);
    this.observed++;
    this.oweAck(entry);
  }

  /** Run each stage's observers in order; the outcomes by lifecycle (also recorded). */
  async observe(batch: ObservationBatch, attempt: number): Promise<Map<string, HookOutcome[]>> {
    const memory = new ObserverMemory();
    const byLifecycle = new Map<string, HookOutcome[]>();
    const spent = new Map<string, number>();
    const ctx = new Context(batch.ctx);
    for (const stage of stagesSeen(batch)) {
      const lifecycle = String(stage.data.lifecycle);
      const began = performance.now();
      const hooks = stage.hooks.flatMap((key) => this.host.hooks.get(key) ?? []);
      const outcomes = await observeStage(hooks, stage, ctx, memory, attempt);
      for (const key of stage.hooks.filter((k) => !this.host.hooks.has(k))) {
        outcomes.push({ hook: key, duration_ms: 0, outcome: 'failed', error: `group '${this.group}' has no hook '${key}'` });
      }
      byLifecycle.set(lifecycle, [...(byLifecycle.get(lifecycle) ?? []), ...outcomes]);
      spent.set(lifecycle, (spent.get(lifecycle) ?? 0) + performance.now() - began);
    }
    for (const [lifecycle, outcomes] of byLifecycle) {
      this.o.events.emit(outcomesRecord('observe', batch.completion_id, lifecycle, outcomes, spent.get(lifecycle) ?? 0, this.group, this.o.replica));
    }
    return byLifecycle;
  }

  private async deadLetter(entry: Entry, reason: string): Promise<void> {
    await setAside(this.o.client, this.o.keys.deadLetter, this.group, {
      source: entry.stream, entryId: entry.entryId, reason, fields: entry.fields, consumer: this.o.replica,
    });
    this.deadLettered++;
    log('dead_lettered', { stream: entry.stream, entry_id: entry.entryId, reason });
  }

  private oweAck(entry: Entry): void {
    this.owed.set(entry.stream, [...(this.owed.get(entry.stream) ?? []), entry.entryId]);
    this.ackTimer ??= setTimeout(() => void this.flushAcks(), ACK_DELAY_MS);
  }

  private async flushAcks(): Promise<void> {
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    const owed = this.owed;
    this.owed = new Map();
    for (const [stream, ids] of owed) {
      try {
        await this.o.client.xack(stream, this.group, ...ids);
        this.acks++;
      } catch (exc) {
        // still pending: run again once claimed (at least once)
        log('observation_ack_failed', { stream, entries: ids.length, error: (exc as Error).message });
      }
    }
  }
}

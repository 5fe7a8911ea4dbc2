/**
 * One replica of a hook-worker group, speaking the Python worker's protocol
 * (hookbus.services.worker.replica), so an orchestrator cannot tell the two apart:
 *
 * - consumer group `{group}` on `hooks:{group}` (every shard), consumer name unique per
 *   replica; an XREADGROUP loop on its own connection reads as many entries as there are
 *   free slots, so `--concurrency N` bounds prefetch + in flight exactly;
 * - reply first, then ack: the replies finished in one event-loop turn go out in one
 *   pipeline, each followed by the XACK of its entry (a Redis connection runs a pipeline in
 *   order, so an entry is never acked before its reply is written); through a connection
 *   failure a hop's reply + ack is retried alone while its deadline allows;
 * - the announcement (with `protocol`), a heartbeat every `heartbeatEvery(claimIdle)`,
 *   claims of a dead sibling's entries once idle `claimIdle` seconds (only when steady),
 *   lease renewal (XCLAIM JUSTID) of running entries every `claimIdle / 3`, dead letters
 *   after `maxDeliveries`, a janitor that trims the stream up to what was acked;
 * - SIGTERM: stop reading and claiming, leave the registry, let in-flight hops finish (up
 *   to DRAIN_SECONDS) with their leases renewed, then exit.
 */

import { hostname } from 'node:os';
import { Redis } from 'ioredis';
import { addDeadLetter } from '../bus/deadLetters.js';
import { EventWriter, type MonitorRecord } from '../bus/events.js';
import { Keys } from '../bus/keys.js';
import { announce, heartbeat, heartbeatEvery, leave } from '../bus/registry.js';
import { claim, findOrphans, pairs, Steadiness, type Claimed } from '../bus/claims.js';
import { pruneConsumers, trimAcked, TRIM_EVERY } from '../bus/trim.js';
import { DecodeError, decodeHop, encodeReply, failureReply, hopParts, type Fields, type HopEvent, type HopReply } from '../wire/envelopes.js';
import type { GroupHost } from './host.js';
import { sendOn, type Onward } from './sendOn.js';
import { log } from '../log.js';

export const DRAIN_SECONDS = 30;
const REPLY_RETRY_GRACE = 5;
const READ_BLOCK_MS = 1000;

export interface ReplicaOptions {
  redisUrl: string;
  prefix?: string;
  shards?: number;
  concurrency?: number;
  replica?: string;
  claimIdle?: number;
  maxDeliveries?: number;
  trimEvery?: number;
}

export function instanceName(role: string): string {
  return `${role}-${hostname()}-${process.pid}`;
}

interface Queued {
  replyTo: string;
  fields: string[];
  stream: string;
  entryId: string;
  onward?: Onward;
  done: (error?: Error) => void;
}

/** Replies ready in one event-loop turn, written in one pipeline, each followed by its ack. */
class ReplyBatcher {
  private queue: Queued[] = [];
  batches = 0;

  constructor(private readonly client: Redis, private readonly group: string) {}

  send(item: Omit<Queued, 'done'>): Promise<void> {
    return new Promise((resolve, reject) => {
      if (!this.queue.length) setImmediate(() => void this.flush());
      this.queue.push({ ...item, done: (error) => (error ? reject(error) : resolve()) });
    });
  }

  private async flush(): Promise<void> {
    const batch = this.queue;
    this.queue = [];
    const pipe = this.client.pipeline();
    for (const q of batch) {
      if (q.onward) pipe.xadd(q.onward.stream, '*', ...q.onward.fields);
      pipe.xadd(q.replyTo, '*', ...q.fields);
      pipe.xack(q.stream, this.group, q.entryId);
    }
    let results: Array<[Error | null, unknown]>;
    try {
      results = ((await pipe.exec()) ?? []) as Array<[Error | null, unknown]>;
    } catch (exc) {
      for (const q of batch) q.done(exc as Error);
      return;
    }
    this.batches++;
    let at = 0;
    for (const q of batch) {
      const [onwardError] = q.onward ? results[at++] ?? [null] : [null];
      const [replyError] = results[at++] ?? [null];
      at++; // the ack: a group or stream gone leaves nothing to ack
      if (onwardError) log('send_on_refused', { onward: q.onward?.hopId, error: onwardError.message }, 'error');
      // a refused reply is acked too (Redis refused it: nobody can ever get it)
      if (replyError) log('reply_refused', { entry_id: q.entryId, reply_to: q.replyTo, error: replyError.message }, 'error');
      q.done();
    }
  }
}

export class WorkerReplica {
  readonly group: string;
  readonly keys: Keys;
  readonly streams: string[];
  readonly replica: string;
  readonly concurrency: number;
  readonly claimIdle: number;
  readonly maxDeliveries: number;
  processed = 0;
  claimed = 0;
  deadLettered = 0;

  private readonly client: Redis;
  private readonly reader: Redis;
  private readonly batcher: ReplyBatcher;
  private readonly events: EventWriter;
  private readonly steadiness: Steadiness;
  private readonly inFlight = new Map<string, { stream: string; entryId: string }>();
  private readonly tasks = new Set<Promise<void>>();
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private stopping = false;
  private startedAt = performance.now();
  private wake: (() => void) | undefined;
  private readLoopDone: Promise<void> | undefined;
  private readonly trimEvery: number;

  constructor(readonly host: GroupHost, options: ReplicaOptions) {
    this.group = host.group;
    this.keys = new Keys(options.prefix ?? 'hookbus:', options.shards ?? 1);
    this.streams = this.keys.hookStreams(this.group);
    this.replica = options.replica ?? instanceName(`worker-${this.group}`);
    this.concurrency = options.concurrency ?? 16;
    this.claimIdle = options.claimIdle ?? 5.0;
    this.maxDeliveries = options.maxDeliveries ?? 3;
    this.trimEvery = options.trimEvery ?? TRIM_EVERY;
    const connection = { maxRetriesPerRequest: null, retryStrategy: (n: number) => Math.min(50 * 2 ** n, 1000) };
    this.client = new Redis(options.redisUrl, { ...connection, connectionName: this.replica });
    this.reader = new Redis(options.redisUrl, { ...connection, connectionName: `${this.replica}-reader` });
    this.client.on('error', (e: Error) => log('redis_error', { error: e.message }));
    this.reader.on('error', (e: Error) => log('redis_error', { connection: 'reader', error: e.message }));
    this.batcher = new ReplyBatcher(this.client, this.group);
    this.events = new EventWriter(this.client, this.keys);
    this.steadiness = new Steadiness(this.claimIdle, heartbeatEvery(this.claimIdle));
  }

  async start(): Promise<void> {
    const info = String(await this.client.info('cluster'));
    if (/cluster_enabled:1/.test(info)) {
      throw new Error('REDIS_URL names a Redis Cluster node: the TypeScript worker supports a single Redis (or Valkey) only');
    }
    await this.ensureGroups();
    await announce(this.client, this.keys, this.host.announcement(), (event, fields) => log(event, fields as Record<string, unknown>));
    await heartbeat(this.client, this.keys, this.group, this.replica);
    this.startedAt = performance.now();
    this.steadiness.started();
    const every = heartbeatEvery(this.claimIdle);
    this.repeat('heartbeat', every, async () => {
      const began = performance.now();
      await heartbeat(this.client, this.keys, this.group, this.replica);
      this.steadiness.heartbeatOk(began);
    });
    this.repeat('claim', this.claimIdle / 2, () => this.claimOnce());
    this.repeat('lease', this.claimIdle / 3, () => this.renewLeases());
    this.repeat('janitor', this.trimEvery, () => this.janitorOnce());
    this.readLoopDone = this.readLoop();
    log('worker_started', { group: this.group, replica: this.replica, concurrency: this.concurrency, claim_idle: this.claimIdle, language: 'typescript' }, 'info');
  }

  /** Drain: read and claim nothing more, leave the registry, finish what runs, ack, close. */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.wake?.();
    this.reader.disconnect();
    await this.readLoopDone;
    for (const name of ['heartbeat', 'claim', 'janitor']) this.cancel(name);
    await leave(this.client, this.keys, this.group, this.replica).catch(() => undefined);
    if (this.tasks.size) {
      await Promise.race([Promise.allSettled([...this.tasks]), sleep(DRAIN_SECONDS * 1000)]);
    }
    this.cancel('lease');
    await this.events.stop();
    await this.client.quit().catch(() => undefined);
    log('worker_stopped', { group: this.group, replica: this.replica, processed: this.processed }, 'info');
  }

  private async ensureGroups(): Promise<void> {
    for (const stream of this.streams) {
      try {
        await this.client.xgroup('CREATE', stream, this.group, '0', 'MKSTREAM');
      } catch (exc) {
        if (!String((exc as Error).message).includes('BUSYGROUP')) throw exc;
      }
    }
  }

  // ------------------------------------------------------------------ read loop

  private async readLoop(): Promise<void> {
    let backoff = 50;
    while (!this.stopping) {
      const free = this.concurrency - this.inFlight.size;
      if (free <= 0) {
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
        continue;
      }
      let result: Array<[string, Array<[string, string[]]>]> | null;
      try {
        result = (await this.reader.xreadgroup(
          'GROUP', this.group, this.replica, 'COUNT', free, 'BLOCK', READ_BLOCK_MS,
          'STREAMS', ...this.streams, ...this.streams.map(() => '>'),
        )) as typeof result;
        backoff = 50;
      } catch (exc) {
        if (this.stopping) break;
        const message = (exc as Error).message;
        log('read_failed', { error: message });
        this.steadiness.trouble();
        if (message.includes('NOGROUP')) await this.ensureGroups().catch(() => undefined);
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 1000);
        continue;
      }
      for (const [stream, entries] of result ?? []) {
        for (const [entryId, flat] of entries) this.deliver(stream, entryId, pairs(flat), 1);
      }
    }
  }

  private deliver(stream: string, entryId: string, fields: Fields, attempt: number): void {
    const key = `${stream} ${entryId}`;
    this.inFlight.set(key, { stream, entryId });
    const task = this.process(stream, entryId, fields, attempt)
      .catch((exc) => log('hop_failed', { entry_id: entryId, error: String((exc as Error)?.message ?? exc) }))
      .finally(() => {
        this.inFlight.delete(key);
        this.tasks.delete(task);
        this.wake?.();
      });
    this.tasks.add(task);
  }

  // ------------------------------------------------------------------- one hop

  async process(stream: string, entryId: string, fields: Fields, attempt: number): Promise<void> {
    let hop: HopEvent;
    let split: [string, string | undefined] | undefined;
    try {
      hop = decodeHop(fields);
    } catch (exc) {
      if (!(exc instanceof DecodeError)) throw exc;
      return this.deadLetter(stream, entryId, fields, exc.message);
    }
    try {
      split = hopParts(hop, fields);
    } catch (exc) {
      return this.deadLetter(stream, entryId, fields, (exc as Error).message, hop);
    }
    if (hop.deadline < Date.now() / 1000) {
      await this.client.xack(stream, this.group, entryId);
      this.record(hop, undefined, 'expired', `deadline passed before attempt ${attempt}`);
      return;
    }
    const { reply: answered, dataJson } = await this.host.answer(hop, attempt, this.replica, split);
    let reply = answered;
    let onward = sendOn(hop, reply, split, dataJson);
    if (onward) reply.forwarded = onward.hopId;
    let replyFields: string[];
    try {
      replyFields = encodeReply(reply, dataJson);
    } catch (exc) {
      // a value in ctx.state or the session that JSON cannot carry: answer a failure,
      // else the hop would be claimed and run again until dead-lettered
      reply = failureReply(hop, this.replica, `the hooks' results are not JSON: ${(exc as Error).message}`, hop.v);
      reply.duration_ms = answered.duration_ms;
      replyFields = encodeReply(reply);
      onward = undefined;
      log('reply_not_encodable', { hop_id: hop.hop_id, completion_id: hop.completion_id }, 'error');
    }
    await this.reply(stream, entryId, hop, replyFields, onward);
    this.processed++;
    this.record(hop, reply, reply.failure ? 'hop_failed' : 'ok', reply.failure);
  }

  private async reply(stream: string, entryId: string, hop: HopEvent, fields: string[], onward: Onward | undefined): Promise<void> {
    try {
      await this.batcher.send({ replyTo: hop.reply_to, fields, stream, entryId, onward });
      return;
    } catch (exc) {
      log('reply_batch_failed', { hop_id: hop.hop_id, error: (exc as Error).message });
    }
    let backoff = 50;
    for (;;) {
      try {
        const pipe = this.client.pipeline();
        if (onward) pipe.xadd(onward.stream, '*', ...onward.fields);
        pipe.xadd(hop.reply_to, '*', ...fields);
        pipe.xack(stream, this.group, entryId);
        await pipe.exec();
        return;
      } catch (exc) {
        if (Date.now() / 1000 + backoff / 1000 > hop.deadline + REPLY_RETRY_GRACE) {
          log('reply_not_sent', { entry_id: entryId, hop_id: hop.hop_id, error: (exc as Error).message }, 'error');
          throw exc;
        }
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 1000);
      }
    }
  }

  /** Move the entry aside; if we know who waits for it, tell them the hop failed. */
  private async deadLetter(stream: string, entryId: string, fields: Fields, reason: string, hop?: HopEvent): Promise<void> {
    const pipe = this.client.pipeline();
    addDeadLetter(pipe, this.keys.deadLetter, { source: stream, entryId, reason, fields, consumer: this.replica });
    if (hop) pipe.xadd(hop.reply_to, '*', ...encodeReply(failureReply(hop, this.replica, `dead-lettered: ${reason}`)));
    pipe.xack(stream, this.group, entryId);
    await pipe.exec();
    this.deadLettered++;
    log('dead_lettered', { stream, entry_id: entryId, reason });
    if (hop) this.record(hop, undefined, 'dead_letter', reason);
  }

  private record(hop: HopEvent, reply: HopReply | undefined, outcome: string, error: string | undefined): void {
    if (reply && outcome === 'ok') {
      const bad = reply.outcomes.filter((o) => o.outcome !== 'ok');
      if (reply.abort || bad.length) {
        outcome = reply.abort ? 'aborted' : bad[0]!.outcome;
        error = (reply.abort?.message as string | undefined) ?? bad[0]?.error;
      }
    }
    const record: MonitorRecord = {
      v: 1, kind: 'hop', ts: Date.now() / 1000, completion_id: hop.completion_id, lifecycle: hop.lifecycle,
      hooks: hop.hooks.length ? hop.hooks.map((h) => `${h.skill}.${h.method}`) : hop.tool ? [`tool:${hop.tool.name}`] : [],
      group: this.group, replica: this.replica, duration_ms: reply?.duration_ms ?? 0, outcome,
    };
    if (error) record.error = error;
    this.events.emit(record);
  }

  // --------------------------------------------------------- background loops

  private repeat(name: string, everySeconds: number, job: () => Promise<unknown>): void {
    const tick = async (): Promise<void> => {
      try {
        await job();
      } catch (exc) {
        if (!this.stopping || name === 'lease') log(`${name}_failed`, { error: (exc as Error).message });
        this.steadiness.trouble();
      }
      if (this.timers.has(name)) this.timers.set(name, setTimeout(tick, everySeconds * 1000));
    };
    this.timers.set(name, setTimeout(tick, everySeconds * 1000));
  }

  private cancel(name: string): void {
    clearTimeout(this.timers.get(name));
    this.timers.delete(name);
  }

  /** One claim pass over every shard: the orphans, as many as there is room for. */
  async claimOnce(): Promise<number> {
    if (this.stopping || !this.steadiness.steady()) return 0;
    let taken = 0;
    for (const stream of this.streams) {
      const busy = new Set(this.inFlight.keys());
      const room = this.concurrency - busy.size;
      const orphans = await findOrphans(
        this.client, stream, this.group, this.replica, this.keys.replicas(this.group), this.claimIdle,
        Math.max(100, this.concurrency * 4),
        { busy, spare: room > 0, uptimeSeconds: (performance.now() - this.startedAt) / 1000 },
      );
      if (!orphans.length || room <= 0 || !this.steadiness.steady()) continue;
      const claimed = await claim(this.client, stream, this.group, this.replica, this.claimIdle, orphans.slice(0, room));
      for (const entry of claimed) this.takeOver(entry);
      taken += claimed.length;
    }
    this.claimed += taken;
    return taken;
  }

  private takeOver(entry: Claimed): void {
    log('claimed', { entry_id: entry.entryId, attempt: entry.attempt, replica: this.replica, previous_owner: entry.previousOwner }, 'info');
    if (entry.attempt > this.maxDeliveries) {
      let hop: HopEvent | undefined;
      try {
        hop = decodeHop(entry.fields);
      } catch {
        hop = undefined;
      }
      const key = `${entry.stream} ${entry.entryId}`;
      this.inFlight.set(key, { stream: entry.stream, entryId: entry.entryId });
      const task = this.deadLetter(entry.stream, entry.entryId, entry.fields, `delivered ${entry.attempt} times without an answer`, hop)
        .catch((exc) => log('dead_letter_failed', { entry_id: entry.entryId, error: (exc as Error).message }))
        .finally(() => {
          this.inFlight.delete(key);
          this.tasks.delete(task);
        });
      this.tasks.add(task);
      return;
    }
    this.deliver(entry.stream, entry.entryId, entry.fields, entry.attempt);
  }

  /** Keep the claims on running hops fresh so siblings do not take them. */
  private async renewLeases(): Promise<void> {
    const byStream = new Map<string, string[]>();
    for (const { stream, entryId } of this.inFlight.values()) byStream.set(stream, [...(byStream.get(stream) ?? []), entryId]);
    for (const [stream, ids] of byStream) {
      await this.client.xclaim(stream, this.group, this.replica, 0, ...ids, 'JUSTID');
    }
  }

  async janitorOnce(): Promise<number> {
    let removed = 0;
    for (const stream of this.streams) {
      removed += await trimAcked(this.client, stream);
      await pruneConsumers(this.client, stream, this.group, this.keys.replicas(this.group));
    }
    return removed;
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * One replica of a hook-worker group, speaking the Python worker's protocol
 * (hookbus.services.worker.replica), so an orchestrator cannot tell the two apart:
 *
 * - consumer group `{group}` on `hooks:{group}` (every shard) and on its version's stream
 *   `hooks:{group}@{version}` (../bus/versions.ts), consumer name unique per replica; the
 *   reading, claims, leases, heartbeat and janitor are its GroupMember's (../bus/member.ts);
 * - reply first, then ack: the replies finished in one event-loop turn go out in one
 *   pipeline, each followed by the XACK of its entry (a Redis connection runs a pipeline in
 *   order, so an entry is never acked before its reply is written); through a connection
 *   failure a hop's reply + ack is retried alone while its deadline allows;
 * - the announcement (with `protocol`), the replica's version (`--version`, else
 *   HOOKBUS_WORKER_VERSION, else the skills' `version`s, else a hash of its hooks:
 *   ./versioning.ts) in `replica-versions:{group}`, dead letters after `maxDeliveries`;
 * - a group with observers also consumes `observe:{group}` (./observer.ts);
 * - SIGTERM: drain (./drain.ts): marked draining, it keeps serving while requests pinned to
 *   its version are left and no sibling of its version serves on; then it stops reading
 *   and claiming, leaves the registry, lets in-flight hops finish (up to DRAIN_SECONDS)
 *   with their leases renewed, deletes its consumer if it holds nothing, and exits.
 */

import { hostname } from 'node:os';
import type { Redis } from 'ioredis';
import { connect, inOrder, type Results } from '../bus/connection.js';
import { setAside } from '../bus/deadLetters.js';
import { EventWriter, type MonitorRecord } from '../bus/events.js';
import { Keys } from '../bus/keys.js';
import { announce, heartbeat, heartbeatEvery, leave } from '../bus/registry.js';
import { Steadiness } from '../bus/claims.js';
import { GroupMember, sleep, type Entry } from '../bus/member.js';
import { deleteConsumerIfIdle, TRIM_EVERY } from '../bus/trim.js';
import { publish, replicaInfos, type ReplicaInfo } from '../bus/versions.js';
import { DecodeError, decodeHop, encodeReply, failureReply, hopParts, type Fields, type HopEvent, type HopReply } from '../wire/envelopes.js';
import type { GroupHost } from './host.js';
import { servePinnedRequests } from './drain.js';
import { ObserverConsumer } from './observer.js';
import { sendOn, type Onward } from './sendOn.js';
import { hooksFingerprint, replicaVersion } from './versioning.js';
import { hopLimits, overHopLimits, type HopLimits } from './limits.js';
import { processSpan, shutdownTracing } from './tracing.js';
import { log } from '../log.js';
import { CONSTANTS } from '../generated/protocol.js';

export const DRAIN_SECONDS = CONSTANTS.timings.drain_limit;
const REPLY_RETRY_GRACE = CONSTANTS.timings.reply_retry_grace;

export interface ReplicaOptions {
  redisUrl: string;
  prefix?: string;
  shards?: number;
  concurrency?: number;
  replica?: string;
  claimIdle?: number;
  maxDeliveries?: number;
  trimEvery?: number;
  /** The reply size limits (default: HOOKBUS_MAX_HOP_BYTES and HOOKBUS_MAX_STATE_BYTES, else the spec's). */
  limits?: HopLimits;
  /** REDIS_URL names a Redis Cluster node (../bus/connection.ts isCluster): Cluster clients and hash-tagged keys. */
  cluster?: boolean;
  /** The version this replica runs its group at (default: ./versioning.ts). */
  version?: string;
  /** Seconds the drain on SIGTERM waits for the requests pinned to the version, at most. */
  drainSeconds?: number;
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
    let results: Results;
    try {
      results = await inOrder(this.client, (pipe) => {
        for (const q of batch) {
          if (q.onward) pipe.xadd(q.onward.stream, '*', ...q.onward.fields);
          pipe.xadd(q.replyTo, '*', ...q.fields);
        }
      }, (pipe) => {
        for (const q of batch) pipe.xack(q.stream, this.group, q.entryId);
      });
    } catch (exc) {
      for (const q of batch) q.done(exc as Error);
      return;
    }
    this.batches++;
    let at = 0;
    for (const q of batch) {  // the acks follow: a group or stream gone leaves nothing to ack
      const [onwardError] = q.onward ? results[at++] ?? [null] : [null];
      const [replyError] = results[at++] ?? [null];
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
  readonly version: string;
  readonly hooksFingerprint: string;
  readonly streams: string[];
  readonly replica: string;
  readonly concurrency: number;
  readonly claimIdle: number;
  readonly maxDeliveries: number;
  readonly member: GroupMember;
  readonly limits: HopLimits;
  /** Runs the group's observers from its observer stream, when it has some. */
  observer: ObserverConsumer | undefined;
  processed = 0;
  deadLettered = 0;

  private readonly client: Redis;
  private readonly batcher: ReplyBatcher;
  private readonly events: EventWriter;
  private readonly steadiness: Steadiness;
  private readonly trimEvery: number;
  private readonly drainSeconds: number;
  private readonly redisUrl: string;
  private stopping = false;
  private readonly startedAt = Date.now() / 1000;

  constructor(readonly host: GroupHost, options: ReplicaOptions) {
    this.group = host.group;
    const cluster = options.cluster ?? false;
    this.keys = new Keys(options.prefix ?? 'hookbus:', options.shards ?? (cluster ? CONSTANTS.keys.cluster_shards : 1), cluster);
    this.hooksFingerprint = hooksFingerprint(host.announcement());
    this.version = replicaVersion(options.version, host.skills, this.hooksFingerprint);
    this.streams = [...this.keys.hookStreams(this.group), ...this.keys.pinnedHookStreams(this.group, this.version)];
    this.replica = options.replica ?? instanceName(`worker-${this.group}`);
    this.concurrency = options.concurrency ?? CONSTANTS.timings.concurrency;
    this.claimIdle = options.claimIdle ?? CONSTANTS.timings.claim_idle;
    this.limits = options.limits ?? hopLimits();
    this.maxDeliveries = options.maxDeliveries ?? CONSTANTS.timings.max_deliveries;
    this.trimEvery = options.trimEvery ?? TRIM_EVERY;
    this.drainSeconds = options.drainSeconds ?? DRAIN_SECONDS;
    this.redisUrl = options.redisUrl;
    this.client = connect(options.redisUrl, this.replica, cluster);
    this.client.on('error', (e: Error) => log('redis_error', { error: e.message }));
    this.batcher = new ReplyBatcher(this.client, this.group);
    this.events = new EventWriter(this.client, this.keys);
    this.steadiness = new Steadiness(this.claimIdle, heartbeatEvery(this.claimIdle));
    this.member = new GroupMember({
      redisUrl: options.redisUrl, cluster, client: this.client, streams: this.streams, group: this.group, replica: this.replica,
      heartbeats: this.keys.replicas(this.group), concurrency: this.concurrency, claimIdle: this.claimIdle,
      trimEvery: this.trimEvery, steadiness: this.steadiness, run: (entry) => this.run(entry), label: 'hop',
      beat: () => heartbeat(this.client, this.keys, this.group, this.replica), beatEvery: heartbeatEvery(this.claimIdle),
    });
  }

  get claimed(): number {
    return this.member.claimed;
  }

  async start(): Promise<void> {
    await this.member.ensureGroups();
    await announce(this.client, this.keys, this.host.announcement(), (event, fields) => log(event, fields as Record<string, unknown>));
    await this.checkSiblings();
    await publish(this.client, this.keys, this.group, this.replica, this.info(false));
    await heartbeat(this.client, this.keys, this.group, this.replica);
    this.steadiness.started();
    this.member.start();
    if (this.host.observes) {
      this.observer = new ObserverConsumer(this.host, {
        redisUrl: this.redisUrl, client: this.client, keys: this.keys, replica: this.replica, events: this.events,
        concurrency: this.concurrency, claimIdle: this.claimIdle, maxDeliveries: this.maxDeliveries,
        trimEvery: this.trimEvery, steadiness: this.steadiness,
      });
      await this.observer.start();
    }
    log('worker_started', {
      group: this.group, replica: this.replica, version: this.version, hooks: this.hooksFingerprint,
      concurrency: this.concurrency, claim_idle: this.claimIdle, language: 'typescript',
    }, 'info');
  }

  private info(draining: boolean): ReplicaInfo {
    return { version: this.version, hooks: this.hooksFingerprint, draining, started: this.startedAt };
  }

  /** Log a sibling that announces this version with other hooks: the version no longer
   * says what runs (orchestrators report it too). */
  private async checkSiblings(): Promise<void> {
    for (const [sibling, info] of await replicaInfos(this.client, this.keys, this.group)) {
      if (sibling !== this.replica && info.version === this.version && info.hooks !== this.hooksFingerprint) {
        log('version_hooks_differ', {
          group: this.group, version: this.version, replica: this.replica, hooks: this.hooksFingerprint, sibling, sibling_hooks: info.hooks,
        }, 'error');
      }
    }
  }

  /** Drain (./drain.ts), then read and claim nothing more, leave the registry, finish what
   * runs (leases still renewed), send the acks owed, delete the consumer, close. */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    try {
      await publish(this.client, this.keys, this.group, this.replica, this.info(true));
      await servePinnedRequests(this.client, this.keys, this.group, this.replica, this.version, this.drainSeconds, this.claimIdle);
    } catch (exc) {
      log('drain_failed', { group: this.group, replica: this.replica, error: (exc as Error).message });
    }
    await this.member.stopReading();
    await this.observer?.stopReading();
    this.member.stop('heartbeat');
    await leave(this.client, this.keys, this.group, this.replica).catch(() => undefined);
    await this.member.finish(DRAIN_SECONDS);
    await this.observer?.stop(DRAIN_SECONDS);
    this.member.stop();
    for (const stream of [...this.streams, ...(this.observer?.member.streams ?? [])]) {
      await deleteConsumerIfIdle(this.client, stream, this.group, this.replica);
    }
    await this.events.stop();
    await this.client.quit().catch(() => undefined);
    await shutdownTracing();
    log('worker_stopped', { group: this.group, replica: this.replica, processed: this.processed }, 'info');
  }

  /** One entry, read or claimed: dead-lettered past `maxDeliveries`, else answered. */
  private async run(entry: Entry): Promise<void> {
    if (entry.attempt <= this.maxDeliveries) return this.process(entry.stream, entry.entryId, entry.fields, entry.attempt);
    let hop: HopEvent | undefined;
    try {
      hop = decodeHop(entry.fields);
    } catch {
      hop = undefined;
    }
    return this.deadLetter(entry.stream, entry.entryId, entry.fields, `delivered ${entry.attempt} times without an answer`, hop);
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
    const span = processSpan(this.group, this.replica, hop.lifecycle, hop.trace, attempt, this.version);
    const { reply: answered, dataJson } = await this.host.answer(hop, attempt, this.replica, split, span?.observe);
    let reply = answered;
    let onward = sendOn(hop, reply, split, dataJson);
    if (onward) reply.forwarded = onward.hopId;
    let replyFields: string[] | undefined;
    let unsendable: string | undefined;
    try {
      replyFields = encodeReply(reply, dataJson);
      unsendable = overHopLimits(replyFields, reply.state, this.limits);
    } catch (exc) {
      // a value in ctx.state or the session that JSON cannot carry
      unsendable = `the hooks' results are not JSON: ${(exc as Error).message}`;
    }
    if (unsendable !== undefined || replyFields === undefined) {
      // answer a failure, else the hop would be claimed and run again until dead-lettered
      reply = failureReply(hop, this.replica, unsendable ?? 'no reply', hop.v);
      reply.duration_ms = answered.duration_ms;
      replyFields = encodeReply(reply);
      onward = undefined;
      log('reply_not_sendable', { hop_id: hop.hop_id, completion_id: hop.completion_id, error: reply.failure }, 'error');
    }
    span?.end(reply.failure);
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
        await inOrder(this.client, (pipe) => {
          if (onward) pipe.xadd(onward.stream, '*', ...onward.fields);
          pipe.xadd(hop.reply_to, '*', ...fields);
        }, (pipe) => pipe.xack(stream, this.group, entryId));
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
    const reply = hop && { to: hop.reply_to, fields: encodeReply(failureReply(hop, this.replica, `dead-lettered: ${reason}`)) };
    await setAside(this.client, this.keys.deadLetter, this.group, { source: stream, entryId, reason, fields, consumer: this.replica }, reply);
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
      group: this.group, replica: this.replica, version: this.version, duration_ms: reply?.duration_ms ?? 0, outcome,
    };
    if (error) record.error = error;
    this.events.emit(record);
  }

  async janitorOnce(): Promise<number> {
    return this.member.janitorOnce();
  }
}


/**
 * The monitor firehose (hookbus.bus.events): one record per hop, buffered and written every
 * FLUSH_EVERY seconds as one MonitorBatch entry per events shard, so monitoring never adds
 * a round trip to a hop. Best effort: a batch Redis refuses is dropped.
 */

import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import { inOrder } from './connection.js';
import type { HookOutcome } from '../runner.js';

const EVENTS_MAXLEN = 100_000;
const FLUSH_EVERY_MS = 100;
const MAX_BUFFER = 50_000;
const MAX_RECORDS_PER_ENTRY = 500;

export interface MonitorRecord {
  v: 1;
  /** `hop`: one hop answered; `observe`: a group's observers of one lifecycle of a request. */
  kind: 'hop' | 'observe';
  ts: number;
  completion_id: string;
  lifecycle: string;
  hooks: string[];
  group: string;
  replica: string;
  /** The version of the group the replica runs (hops). */
  version?: string;
  duration_ms: number;
  outcome: string;
  error?: string;
}

/** The record of some hooks' calls (a hook named once, however many calls it had): their
 * first failure, if any, is its outcome (MonitorRecord.of_outcomes). */
export function outcomesRecord(
  kind: MonitorRecord['kind'], completionId: string, lifecycle: string, outcomes: readonly HookOutcome[],
  durationMs: number, group: string, replica: string,
): MonitorRecord {
  const bad = outcomes.find((o) => o.outcome !== 'ok');
  const record: MonitorRecord = {
    v: 1, kind, ts: Date.now() / 1000, completion_id: completionId, lifecycle, hooks: [...new Set(outcomes.map((o) => o.hook))],
    group, replica, duration_ms: durationMs, outcome: bad?.outcome ?? 'ok',
  };
  if (bad?.error !== undefined) record.error = bad.error;
  return record;
}

export class EventWriter {
  private buffer: MonitorRecord[] = [];
  private timer: NodeJS.Timeout | undefined;
  private recordsPerEntry = 1;
  private readonly maxPerShard: number;

  constructor(private readonly client: Redis, private readonly keys: Keys) {
    this.maxPerShard = Math.max(1, Math.floor(EVENTS_MAXLEN / keys.shards));
  }

  emit(record: MonitorRecord): void {
    if (this.buffer.length >= MAX_BUFFER) return; // Redis unreachable for long: monitoring gives way
    this.buffer.push(record);
    this.timer ??= setTimeout(() => {
      this.timer = undefined;
      this.flush().catch(() => undefined);
    }, FLUSH_EVERY_MS);
  }

  async flush(): Promise<void> {
    if (!this.buffer.length) return;
    const batch = this.buffer;
    this.buffer = [];
    const byStream = new Map<string, MonitorRecord[]>();
    for (const record of batch) {
      const stream = this.keys.eventsFor(record.completion_id);
      const list = byStream.get(stream) ?? [];
      list.push(record);
      byStream.set(stream, list);
    }
    const cap = Math.max(1, Math.floor(this.maxPerShard / this.recordsPerEntry));
    const sizes: number[] = [];
    await inOrder(this.client, (pipe) => {
      for (const [stream, records] of byStream) {
        for (let start = 0; start < records.length; start += MAX_RECORDS_PER_ENTRY) {
          const part = records.slice(start, start + MAX_RECORDS_PER_ENTRY);
          pipe.xadd(stream, 'MAXLEN', '~', cap, '*', 'e', JSON.stringify({ v: 1, kind: 'batch', records: part }));
          sizes.push(part.length);
        }
      }
    });
    for (const size of sizes) this.recordsPerEntry += 0.05 * (size - this.recordsPerEntry);
  }

  async stop(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.flush().catch(() => undefined);
  }
}

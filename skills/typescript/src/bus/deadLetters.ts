/**
 * The dead-letter stream (hookbus.bus.deadletter): where an entry that could not be decoded,
 * or was delivered too many times, is set aside. A dead letter describes the original by
 * each field's size and SHA-256 and the envelope's routing fields, never its content
 * (prompts and credentials stay out of it); retention is bounded in entries and time.
 */

import { createHash } from 'node:crypto';
import type { ChainableCommander, Redis } from 'ioredis';
import { inOrder } from './connection.js';

const MAXLEN = 10_000;
const RETENTION = 7 * 24 * 3600;
const REASON_CHARS = 1000;
const ROUTING_CHARS = 200;
const PARSE_AT_MOST = 256 * 1024;
const ROUTING_TEXT = ['kind', 'completion_id', 'hop_id', 'lifecycle', 'stage_key', 'replica'];
const ROUTING_NUMBERS = ['v', 'epoch', 'deadline', 'created'];

export function describe(fields: Record<string, string>): string {
  const described: Record<string, { bytes: number; sha256: string }> = {};
  for (const [key, value] of Object.entries(fields).slice(0, 16)) {
    const bytes = Buffer.from(value);
    described[key.slice(0, 64)] = { bytes: bytes.length, sha256: createHash('sha256').update(bytes).digest('hex') };
  }
  return JSON.stringify({ fields: described, routing: routing(fields.e) });
}

function routing(raw: string | undefined): Record<string, unknown> {
  if (raw === undefined || raw.length > PARSE_AT_MOST) return {};
  let envelope: unknown;
  try {
    envelope = JSON.parse(raw);
  } catch {
    return {};
  }
  if (typeof envelope !== 'object' || envelope === null || Array.isArray(envelope)) return {};
  const e = envelope as Record<string, unknown>;
  const kept: Record<string, unknown> = {};
  for (const name of ROUTING_TEXT) if (typeof e[name] === 'string') kept[name] = (e[name] as string).slice(0, ROUTING_CHARS);
  for (const name of ROUTING_NUMBERS) if (typeof e[name] === 'number') kept[name] = e[name];
  return kept;
}

/** Queue the dead letter and its trims on `pipe` (the caller acks in the same pipeline). */
export function addDeadLetter(
  pipe: ChainableCommander, stream: string,
  entry: { source: string; entryId: string; reason: string; fields: Record<string, string>; consumer: string },
): void {
  const now = Date.now() / 1000;
  const reason = entry.reason.slice(0, 4 * REASON_CHARS).replace(/input_value=.*?, input_type=/g, 'input_type=').slice(0, REASON_CHARS);
  pipe.xadd(
    stream, 'MAXLEN', '~', MAXLEN, '*',
    'source', entry.source.slice(0, ROUTING_CHARS), 'entry_id', entry.entryId.slice(0, ROUTING_CHARS),
    'reason', reason, 'consumer', entry.consumer.slice(0, ROUTING_CHARS), 'ts', String(now),
    'original', describe(entry.fields),
  );
  pipe.xtrim(stream, 'MINID', `${Math.floor((now - RETENTION) * 1000)}-0`);
  pipe.expire(stream, RETENTION);
}

/** Move an entry of `group` to the dead-letter stream, tell its caller when `reply` says
 * who waits (a failure reply), then ack it: in that order, on a Cluster too. */
export async function setAside(
  client: Redis, deadLetter: string, group: string,
  entry: { source: string; entryId: string; reason: string; fields: Record<string, string>; consumer: string },
  reply?: { to: string; fields: string[] },
): Promise<void> {
  await inOrder(client, (pipe) => {
    addDeadLetter(pipe, deadLetter, entry);
    if (reply) pipe.xadd(reply.to, '*', ...reply.fields);
  }, (pipe) => pipe.xack(entry.source, group, entry.entryId));
}

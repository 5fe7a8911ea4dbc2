/**
 * Keeping the group's stream bounded without losing an unacknowledged entry
 * (hookbus.bus.trim): one Lua script trims up to the oldest entry some consumer group
 * still needs, atomically; consumers gone for long that hold nothing are forgotten.
 */

import type { Redis } from 'ioredis';
import { CONSTANTS } from '../generated/protocol.js';

export const TRIM_EVERY = CONSTANTS.timings.trim_every;
const FORGET_AFTER = CONSTANTS.timings.forget_after;

const TRIM = `
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, ''} end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return {0, ''} end
local function parse(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local best_ms, best_seq = nil, nil
for _, g in ipairs(groups) do
  local info = {}
  for k = 1, #g, 2 do info[g[k]] = g[k + 1] end
  local ms, seq
  if tonumber(info['pending']) > 0 then
    local summary = redis.call('XPENDING', KEYS[1], info['name'])
    ms, seq = parse(summary[2])
  else
    ms, seq = parse(info['last-delivered-id'])
    seq = seq + 1
  end
  if best_ms == nil or ms < best_ms or (ms == best_ms and seq < best_seq) then
    best_ms, best_seq = ms, seq
  end
end
local minid = string.format('%d-%d', best_ms, best_seq)
return {redis.call('XTRIM', KEYS[1], 'MINID', minid), minid}
`;

const PRUNE = `
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local pending = {}
for _, c in ipairs(consumers) do
  local info = {}
  for k = 1, #c, 2 do info[c[k]] = c[k + 1] end
  pending[info['name']] = tonumber(info['pending'])
end
local removed = 0
for i = 2, #ARGV do
  if pending[ARGV[i]] == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    removed = removed + 1
  end
end
return removed
`;

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

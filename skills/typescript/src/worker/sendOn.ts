/**
 * A stage sent on to the next worker group (hookbus.bus.route): when the hop lists the
 * stage's next segments (`route`) and this group's hooks let the stage go on, the worker
 * writes the next group's hop itself, in the same pipeline as (and before) its reply, so
 * the stage costs one round trip per group instead of two. The hop sent on carries the
 * data and the context as the orchestrator would have sent them.
 */

import { stageGoesOn } from '../runner.js';
import { encodeHop, type HopEvent, type HopReply } from '../wire/envelopes.js';

export interface Onward {
  stream: string;
  hopId: string;
  fields: string[];
}

export function sendOn(hop: HopEvent, reply: HopReply, split: [string, string | undefined] | undefined, dataJson: string | undefined): Onward | undefined {
  if (!hop.route?.length || !split || hop.chunks || reply.failure) return undefined;
  if (!stageGoesOn(hop.lifecycle, reply.abort !== undefined, reply.blocked)) return undefined;
  const now = Date.now() / 1000;
  if (now >= hop.deadline) return undefined;
  const [step, ...rest] = hop.route;
  const ctx = JSON.parse(split[0]) as Record<string, unknown>;
  ctx.state = reply.state;
  const session = (ctx.session ?? {}) as Record<string, unknown>;
  session.data = reply.session;
  ctx.session = session;
  let ctxJson: string;
  try {
    ctxJson = JSON.stringify(ctx);
  } catch {
    return undefined; // state JSON cannot carry: the reply fails too
  }
  const onward: HopEvent = {
    v: 2, kind: 'hop', hop_id: step!.hop_id, completion_id: hop.completion_id, lifecycle: hop.lifecycle,
    stage_key: hop.stage_key, hooks: step!.hooks, ctx: {}, reply_to: hop.reply_to,
    deadline: now + step!.timeout, epoch: hop.epoch, chunks: 0, route: rest.length ? rest : null,
  };
  return { stream: step!.stream, hopId: step!.hop_id, fields: encodeHop(onward, dataJson ?? split[1] ?? '', ctxJson) };
}

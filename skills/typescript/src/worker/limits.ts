/**
 * How large a reply may be (hookbus.bus.limits.over_hop_limits): the bytes of its entry's
 * field values (HOOKBUS_MAX_HOP_BYTES) and of its `ctx.state` as JSON
 * (HOOKBUS_MAX_STATE_BYTES), with the spec's defaults. Over either, the replica writes a
 * failure reply naming the variable instead of the hooks' results: large payloads stay in
 * Redis until trimmed, and one request must not fill it.
 */

import { CONSTANTS } from '../generated/protocol.js';

const { max_hop_bytes: HOP, max_state_bytes: STATE } = CONSTANTS.limits;

export interface HopLimits {
  maxHopBytes: number;
  maxStateBytes: number;
}

function positive(env: string, raw: string | undefined, fallback: number): number {
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value <= 0) throw new RangeError(`${env} needs a positive whole number of bytes, not ${JSON.stringify(raw)}`);
  return value;
}

/** The limits the environment sets, else the spec's defaults (a RangeError for a bad value). */
export function hopLimits(env: NodeJS.ProcessEnv = process.env): HopLimits {
  return {
    maxHopBytes: positive(HOP.env, env[HOP.env], HOP.default),
    maxStateBytes: positive(STATE.env, env[STATE.env], STATE.default),
  };
}

/** Python's `f"{n:,}"`. */
const grouped = (n: number): string => n.toLocaleString('en-US');

/** Why a reply entry (`fields`: name, value, ...) may not be written, in the Python worker's
 * words; undefined when it may. The state is measured only when the entry could be over. */
export function overHopLimits(fields: readonly string[], state: unknown, limits: HopLimits): string | undefined {
  let size = 0;
  for (let i = 1; i < fields.length; i += 2) size += Buffer.byteLength(fields[i]!);
  if (size > limits.maxStateBytes) {
    const stateBytes = Buffer.byteLength(JSON.stringify(state ?? {}));
    if (stateBytes > limits.maxStateBytes) {
      return `ctx.state is ${grouped(stateBytes)} bytes as JSON, over its limit of ${grouped(limits.maxStateBytes)} `
        + `(${STATE.env}): keep large data elsewhere and put a key in the state`;
    }
  }
  if (size > limits.maxHopBytes) {
    return `the hooks' results are ${grouped(size)} bytes, over a hop's limit of ${grouped(limits.maxHopBytes)} (${HOP.env})`;
  }
  return undefined;
}

/**
 * The observations of one request for one worker group (hookbus.bus.wire.observations):
 * one entry on `observe:{group}`, written by the orchestrator when the request is over,
 * its field `e` an ObservationBatch with the request's stages in the order they ended.
 * Two things keep it small, undone here by `stagesSeen`: a stage's `state` is null when
 * `ctx.state` is as at the stage before, and an on_chunk stage's `full_content` is left
 * out when it is the previous on_chunk stage's plus `grow`.
 */

import { EnvelopeCheck, isNumber, isObject, isString, type Fields } from './envelopes.js';

export const OBSERVATIONS_VERSION = 1;

export interface ObservedStage {
  lifecycle: string;
  stage_key: string;
  /** Keys (skill.method) of the group's observers of this stage, in order. */
  hooks: string[];
  started: number;
  ended: number;
  state?: Record<string, unknown> | null;
  grow?: string | null;
  data: Record<string, unknown>;
}

export interface ObservationBatch {
  v: number;
  kind: 'observations';
  completion_id: string;
  group: string;
  /** The request's context as it ended, without state (each stage has its own). */
  ctx: Record<string, unknown>;
  stages: ObservedStage[];
}

/** One stage as its observers get it, every state and full_content filled in. */
export interface StageSeen {
  hooks: string[];
  data: Record<string, unknown>;
  state: Record<string, unknown>;
  stageKey: string;
  started: number;
  ended: number;
}

function isStage(v: unknown): boolean {
  return (
    isObject(v) && isString(v.lifecycle) && isString(v.stage_key) && Array.isArray(v.hooks) && v.hooks.every(isString)
    && isNumber(v.started) && isNumber(v.ended) && isObject(v.data) && (v.state == null || isObject(v.state))
    && (v.grow == null || isString(v.grow))
  );
}

export function decodeObservations(fields: Fields): ObservationBatch {
  return new EnvelopeCheck(fields, 'ObservationBatch')
    .need('kind', (v) => v === 'observations', "'observations'", true)
    .need('completion_id', isString, 'a valid string')
    .need('group', isString, 'a valid string')
    .need('ctx', isObject, 'a valid dictionary')
    .need('stages', (v) => Array.isArray(v) && v.every(isStage), 'a list of observed stages')
    .valid<ObservationBatch>([OBSERVATIONS_VERSION]);
}

export function stagesSeen(batch: ObservationBatch): StageSeen[] {
  let state: Record<string, unknown> = {};
  let full = '';
  return batch.stages.map((stage) => {
    if (stage.state != null) state = stage.state;
    const data: Record<string, unknown> = { ...stage.data, lifecycle: stage.data.lifecycle ?? stage.lifecycle };
    if (data.lifecycle === 'on_chunk') {
      if (stage.grow != null) {
        full += stage.grow;
        data.full_content = full;
      } else {
        full = typeof data.full_content === 'string' ? data.full_content : '';
      }
    }
    return { hooks: stage.hooks, data, state, stageKey: stage.stage_key, started: stage.started, ended: stage.ended };
  });
}

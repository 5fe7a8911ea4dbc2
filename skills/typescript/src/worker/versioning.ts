/**
 * The version a replica runs its group at (hookbus.services.worker.versioning): given by
 * the deployment (`--version`, else HOOKBUS_WORKER_VERSION), else the skills' own
 * `version`s when every skill declares one, else `h-` and a short hash of what the group
 * serves. The hooks' set and priorities are fingerprinted beside the version the way the
 * Python worker does it (the same JSON, the same hash), so two replicas announcing one
 * version with different hooks are reported, whichever language each is written in.
 */

import { createHash } from 'node:crypto';
import { checkVersion } from '../bus/versions.js';
import type { GroupAnnouncement } from './host.js';
import type { Skill } from '../skill.js';

type Cell = string | number | boolean;

/** Python's order of lists of str/int/bool (element by element; a prefix first). */
function pythonOrder(a: readonly Cell[], b: readonly Cell[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a[i] !== b[i]) return a[i]! < b[i]! ? -1 : 1;
  }
  return a.length - b.length;
}

/** `json.dumps(value, separators=(",", ":"))`: non-ASCII escaped as Python does. */
function pythonJson(value: unknown): string {
  return JSON.stringify(value).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** 8 hex digits over the hooks (skill, method, lifecycle, priority, scope, critical) and the
 * tools a group serves, independent of their order. */
export function hooksFingerprint(announcement: Pick<GroupAnnouncement, 'hooks' | 'tools'>): string {
  const hooks = announcement.hooks.map((h): Cell[] => [h.skill, h.method, h.lifecycle, h.priority, h.scope, h.critical]);
  const tools = announcement.tools.map((t): Cell[] => [t.skill, t.name]);
  const body = pythonJson({ hooks: hooks.sort(pythonOrder), tools: tools.sort(pythonOrder) });
  return createHash('sha256').update(body).digest('hex').slice(0, 8);
}

/** `given` (the flag), else the environment, else the skills' declared versions (the
 * version alone for one skill; `name-version` joined by `+` for several), else `h-<fingerprint>`. */
export function replicaVersion(given: string | undefined, skills: readonly Skill[], fingerprint: string, env = process.env): string {
  const chosen = given || env.HOOKBUS_WORKER_VERSION;
  if (chosen) return checkVersion(chosen);
  if (skills.length && skills.every((s) => s.version)) {
    if (skills.length === 1) return checkVersion(String(skills[0]!.version));
    return checkVersion(skills.map((s) => `${s.name}-${String(s.version)}`).join('+'));
  }
  return `h-${fingerprint}`;
}

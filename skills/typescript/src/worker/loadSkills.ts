/**
 * The skills a worker hosts, from TypeScript or JavaScript files: every Skill subclass the
 * file exports or defines at its top level (the lifecycle page's examples define their
 * classes without exporting them), or only the one named as `file.ts:ClassName`.
 *
 * A class that is defined but not exported is unreachable from outside its module, so a
 * file with such classes is imported through a copy beside it (same directory, so its
 * relative imports resolve the same) with one line added that exports them; the copy is
 * a TypeScript ES module (`.mts`) and is deleted as soon as it is loaded; every file but an
 * `.mts` without such classes is loaded through one (see `importModule`). TypeScript is
 * compiled by `tsx` (registered by the `hookbus-worker` command).
 */

import { readFile, unlink, writeFile } from 'node:fs/promises';
import { basename, dirname, extname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { isSkillClass, type Skill } from '../skill.js';

export class SpecError extends Error {}

/** `path` or `path:ClassName` (a drive letter's colon is not a separator). */
export function parseSpec(spec: string): { path: string; className?: string } {
  const match = /^(.*\.[cm]?[jt]sx?):([A-Za-z_$][\w$]*)$/.exec(spec);
  return match ? { path: match[1]!, className: match[2] } : { path: spec };
}

const CLASS = /^[ \t]*(?:export[ \t]+)?(?:default[ \t]+)?(?:abstract[ \t]+)?class[ \t]+([A-Za-z_$][\w$]*)/gm;
const EXPORTED = /^[ \t]*export[ \t]/;

/** Classes the source defines, in order, and which of them a line of their own exports.
 * A regular expression, not a parser (the TypeScript compiler costs seconds to load): a
 * name it finds that is not a top-level class is harmless, see `exportLine`. */
export function classesIn(source: string): { all: string[]; hidden: string[] } {
  const all: string[] = [];
  const hidden: string[] = [];
  for (const match of source.matchAll(CLASS)) {
    const name = match[1]!;
    if (all.includes(name)) continue;
    all.push(name);
    if (!EXPORTED.test(match[0])) hidden.push(name);
  }
  return { all, hidden };
}

/** One statement, appended at the end of the module, exporting the classes found by name:
 * `typeof` guards each, so a name that is no top-level binding exports `undefined`
 * instead of failing. */
export function exportLine(names: readonly string[]): string {
  const items = names.map((n) => `typeof ${n} === 'undefined' ? undefined : ${n}`).join(', ');
  return `\n;export const __hookbusDefinedSkills = [${items}];\n`;
}

async function importModule(path: string): Promise<Record<string, unknown>> {
  let source: string;
  try {
    source = await readFile(path, 'utf8');
  } catch (exc) {
    throw new SpecError(`cannot read ${path}: ${(exc as Error).message}`);
  }
  const { hidden } = classesIn(source);
  // the copy is TypeScript and an ES module, whatever the file: a .ts or .js file outside
  // a `"type": "module"` package would load as CommonJS, which cannot import this ES
  // module package on Node 20, and only TypeScript gets its decorators compiled (tsx)
  if (!hidden.length && path.endsWith('.mts')) return (await import(pathToFileURL(path).href)) as Record<string, unknown>;
  const copy = join(dirname(path), `.${basename(path, extname(path))}.hookbus-${process.pid}.mts`);
  await writeFile(copy, source + (hidden.length ? exportLine(hidden) : '\n'));
  try {
    return (await import(pathToFileURL(copy).href)) as Record<string, unknown>;
  } finally {
    await unlink(copy).catch(() => undefined);
  }
}

/** One instance of each skill class the specs name, in the files' order and each file's
 * definition order (the tie-break among hooks of equal priority), each class once. */
export async function loadSkills(specs: readonly string[]): Promise<Skill[]> {
  const classes: Array<new () => Skill> = [];
  for (const spec of specs) {
    const { path, className } = parseSpec(spec);
    const absolute = resolve(path);
    const { all } = classesIn(await readFile(absolute, 'utf8').catch(() => ''));
    const module = await importModule(absolute);
    const candidates = new Map<string, unknown>(Object.entries(module));
    for (const value of (module.__hookbusDefinedSkills as unknown[] | undefined) ?? []) {
      if (typeof value === 'function' && !candidates.has(value.name)) candidates.set(value.name, value);
    }
    candidates.delete('__hookbusDefinedSkills');
    const found = [...candidates]
      .filter(([name, value]) => (className ? name === className : true) && isSkillClass(value))
      .map(([name, value]) => ({ name, cls: value as new () => Skill, at: all.indexOf((value as { name: string }).name) }))
      .sort((a, b) => (a.at < 0 ? Infinity : a.at) - (b.at < 0 ? Infinity : b.at) || a.name.localeCompare(b.name));
    if (className && !found.length) throw new SpecError(`${path} has no Skill subclass named ${className}`);
    if (!found.length) throw new SpecError(`${path} defines no Skill subclass (extend Skill from 'hookbus')`);
    for (const { cls } of found) if (!classes.includes(cls)) classes.push(cls);
  }
  // a base class without hooks or tools of its own (onCompaction is a hook) serves nothing
  return classes.map((cls) => new cls()).filter((s) => s.boundHooks().length || s.boundTools().length);
}

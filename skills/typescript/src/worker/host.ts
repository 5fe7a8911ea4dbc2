/**
 * The skills one worker group hosts, and how one hop is answered: a hop goes in, a reply
 * comes out, no Redis here (hookbus.services.worker.host, in TypeScript). Hooks run
 * through the same failure rules as Python hooks (../runner.ts).
 */

import { Context } from '../context.js';
import { dumpData } from '../data.js';
import { runHooks, type HookObserver, type HookOutcome } from '../runner.js';
import type { BoundHook, BoundTool, Skill } from '../skill.js';
import type { HookDescriptor, ToolDescriptor } from '../descriptors.js';
import { dumpKept, dumpResults, HeldText, KeptTexts, loadChunks, loadKeptChunks } from '../wire/chunkBatch.js';
import { PROTOCOL, type HopEvent, type HopReply, type HookTiming } from '../wire/envelopes.js';

/** What the registry holds for a group (hookbus.bus.groups.registry.GroupAnnouncement),
 * with the protocol version this worker speaks (on_compaction hooks are hooks like the others). */
export interface GroupAnnouncement {
  v: number;
  group: string;
  hooks: HookDescriptor[];
  tools: ToolDescriptor[];
  first_seen: number;
  protocol: string;
}

/** A reply and, for a version 2 hop whose data the hooks changed, that data's JSON. */
export interface Answer {
  reply: HopReply;
  dataJson?: string;
}

class HopProblem extends Error {}

export class GroupHost {
  readonly hooks = new Map<string, BoundHook>();
  readonly tools = new Map<string, BoundTool>();
  /** The text so far of the streams whose batched on_chunk hops came here (protocol 1.1). */
  readonly texts: KeptTexts;

  constructor(readonly group: string, readonly skills: readonly Skill[], keptChars?: number) {
    this.texts = new KeptTexts(keptChars);
    if (skills.length === 0) throw new Error(`worker group ${JSON.stringify(group)} needs at least one skill`);
    for (const skill of skills) {
      for (const h of skill.boundHooks()) this.hooks.set(h.key, h);
      for (const t of skill.boundTools()) this.tools.set(t.descriptor.name, t);
    }
  }

  /** Whether the group hosts an observer (else a replica reads no observer stream). */
  get observes(): boolean {
    return [...this.hooks.values()].some((h) => h.descriptor.observe);
  }

  announcement(): GroupAnnouncement {
    return {
      v: 1,
      group: this.group,
      hooks: [...this.hooks.values()].map((h) => h.descriptor),
      tools: [...this.tools.values()].map((t) => t.descriptor),
      first_seen: Date.now() / 1000,
      protocol: PROTOCOL,
    };
  }

  /** Run the hop's hooks (or tool) and build the reply;
   * hop-level problems (an unknown hook, unreadable data) become its `failure`; `observe`
   * wraps each hook call (its tracing span: ./tracing.ts). */
  async answer(hop: HopEvent, attempt: number, replica: string, split?: [string, string | undefined], observe?: HookObserver): Promise<Answer> {
    const started = performance.now();
    const reply: HopReply = {
      v: hop.v, kind: 'reply', hop_id: hop.hop_id, completion_id: hop.completion_id, replica,
      state: {}, session: {}, blocked: false, outcomes: [], duration_ms: 0, processed: 0,
    };
    let dataJson: string | undefined;
    try {
      const ctx = new Context(split ? JSON.parse(split[0]) : hop.ctx);
      if (hop.tool) {
        reply.tool_result = await this.callTool(hop, ctx);
      } else {
        dataJson = await this.runHooks(hop, ctx, attempt, split, reply, observe);
      }
      reply.state = ctx.state;
      reply.session = ctx.session.data;
    } catch (exc) {
      // a hook's own failures never get here (the runner keeps them): this is the hop's
      const failure = exc instanceof Error ? exc.message : String(exc);
      Object.assign(reply, { failure, state: {}, session: {}, outcomes: [], blocked: false, processed: 0 });
      delete reply.abort;
      delete reply.data;
      delete reply.tool_result;
      dataJson = undefined;
    }
    reply.duration_ms = performance.now() - started;
    return { reply, dataJson };
  }

  private bound(hop: HopEvent): BoundHook[] {
    return hop.hooks.map((ref) => {
      const key = `${ref.skill}.${ref.method}`;
      const hook = this.hooks.get(key);
      if (!hook) throw new HopProblem(`group '${this.group}' has no hook '${key}'`);
      return hook;
    });
  }

  /** Fills the reply of a hook hop; returns the changed data's JSON (version 2 only). */
  private async runHooks(
    hop: HopEvent, ctx: Context, attempt: number, split: [string, string | undefined] | undefined, reply: HopReply, observe?: HookObserver,
  ): Promise<string | undefined> {
    const bound = this.bound(hop);
    const sent = split?.[1];
    if (hop.chunks) {
      if (!sent) throw new HopProblem("a batched on_chunk hop needs its chunks in the 'd' field");
      return this.runChunks(hop, bound, sent, ctx, attempt, reply, observe);
    }
    const raw: Record<string, unknown> = split
      ? (sent ? JSON.parse(sent) : { lifecycle: hop.lifecycle })
      : (hop.data ?? { lifecycle: hop.lifecycle });
    const before = split ? dumpData(raw) : '';
    const result = await runHooks(bound, raw, ctx, hop.stage_key, attempt, observe);
    if (result.abort) reply.abort = result.abort as unknown as Record<string, unknown>;
    reply.blocked = result.blocked;
    reply.outcomes = timings(result.outcomes);
    if (!split) {
      reply.data = JSON.parse(dumpData(result.data));
      return undefined;
    }
    const after = dumpData(result.data);
    return after !== before ? after : undefined;
  }

  /** The chain over each chunk in turn (each sees the state the previous one left, and
   * the held text as the earlier chunks left it), up to a HookError; per hook, the reply's
   * outcome sums its calls' time and keeps its first failure. A protocol 1.1 batch
   * (`hop.text`) gets each chunk's `full_content` from the stream's text kept here; without
   * that text no hook runs and the reply asks for it. */
  private async runChunks(
    hop: HopEvent, bound: BoundHook[], raw: string, ctx: Context, attempt: number, reply: HopReply, observe?: HookObserver,
  ): Promise<string | undefined> {
    const kept = hop.text ?? undefined;
    const chunks = kept ? loadKeptChunks(raw) : loadChunks(raw);
    let text: string | undefined;
    if (kept) {
      text = this.texts.take(kept, chunks[0]!.chunk_index as number);
      if (text === undefined) {
        reply.needs_text = true;
        return undefined;
      }
    }
    const dump = kept ? dumpKept : dumpData;
    const results: Array<string | null> = [];
    const perHook = new Map<string, HookOutcome>();
    const held = new HeldText();
    for (const chunk of chunks) {
      if (text !== undefined) {
        text += typeof chunk.content === 'string' ? chunk.content : '';
        chunk.full_content = text;
      }
      const before = dump(chunk);
      held.give(chunk);
      const result = await runHooks(bound, chunk, ctx, `on_chunk#${String(chunk.chunk_index)}`, attempt, observe);
      held.took(result.data);
      const after = dump(result.data);
      results.push(after !== before ? after : null);
      for (const o of result.outcomes) {
        const seen = perHook.get(o.hook);
        if (!seen) {
          perHook.set(o.hook, { ...o });
          continue;
        }
        seen.duration_ms += o.duration_ms;
        if (seen.error === undefined && o.error !== undefined) {
          seen.outcome = o.outcome;
          seen.error = o.error;
        }
      }
      if (result.abort) {
        reply.abort = result.abort as unknown as Record<string, unknown>;
        break;
      }
    }
    if (kept && text !== undefined) this.texts.keep(kept, text, (chunks[results.length - 1]!.chunk_index as number) + 1);
    reply.processed = results.length;
    reply.outcomes = timings([...perHook.values()]);
    return results.some((r) => r !== null) ? dumpResults(results) : undefined;
  }

  /** The tool's answer as the model sees it: every problem becomes text, never a crash. */
  private async callTool(hop: HopEvent, ctx: Context): Promise<string> {
    const invocation = hop.tool!;
    const bound = this.tools.get(invocation.name);
    if (!bound) throw new HopProblem(`group '${this.group}' has no tool '${invocation.name}'`);
    const name = `'${invocation.name}'`;
    const missing = requiredMissing(bound.descriptor, invocation.arguments);
    if (missing.length) {
      return `Error: invalid arguments for tool ${name}: ${missing.map((m) => `${m}: Field required`).join('; ')}`;
    }
    try {
      const result = await runTool(bound, invocation.arguments, ctx);
      return typeof result === 'string' ? result : JSON.stringify(result ?? null);
    } catch (exc) {
      if (exc instanceof ToolTimeout) return `Error: tool ${name} timed out after ${exc.message}s`;
      const error = exc instanceof Error ? `${exc.name}: ${exc.message}` : `Error: ${String(exc)}`;
      return `Error: tool ${name} failed: ${error}`;
    }
  }
}

class ToolTimeout extends Error {}

async function runTool(bound: BoundTool, args: Record<string, unknown>, ctx: Context): Promise<unknown> {
  const timeout = bound.descriptor.timeout;
  const running = Promise.resolve().then(() => bound.fn(args, ctx));
  if (timeout === null) return running;
  let timer: NodeJS.Timeout | undefined;
  running.catch(() => undefined);
  try {
    return await Promise.race([
      running,
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new ToolTimeout(Number.isInteger(timeout) ? timeout.toFixed(1) : String(timeout))), timeout * 1000);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** The `required` arguments of the tool's schema that the call leaves out (the one check
 * made here: TypeScript types do not exist at run time to validate against). */
function requiredMissing(descriptor: ToolDescriptor, args: Record<string, unknown>): string[] {
  const fn = (descriptor.parameters_schema as { function?: { parameters?: { required?: unknown } } }).function;
  const required = fn?.parameters?.required;
  return Array.isArray(required) ? required.filter((name) => typeof name === 'string' && !(name in args)) : [];
}

function timings(outcomes: readonly HookOutcome[]): HookTiming[] {
  return outcomes.map((o) => {
    const t: HookTiming = { hook: o.hook, duration_ms: o.duration_ms, outcome: o.outcome };
    if (o.error !== undefined) t.error = o.error;
    return t;
  });
}

// The lifecycle page's TypeScript examples, as hookbus's own skills: the same classes,
// names, hooks, lifecycles and priorities, importing from 'hookbus'. The classes are not
// exported (neither are the page's): the worker finds them in the file.
//
// Where the page prints with console.log, these write one JSON line per hook call to the
// file named by HOOKBUS_TS_JOURNAL (the end-to-end test reads the order and the values
// from it; without it they print, as the page does).
import { Skill, hook } from 'hookbus';
import type { HookData, Context } from 'hookbus';
import { appendFileSync } from 'node:fs';

function note(ctx: Context, hookName: string, extra: Record<string, unknown> = {}): void {
  const line = JSON.stringify({ lang: 'ts', cid: ctx.metadata.completion_id, hook: hookName, ...extra });
  const journal = process.env.HOOKBUS_TS_JOURNAL;
  if (journal) appendFileSync(journal, line + '\n');
  else console.log(line);
}

class AnalyticsSkill extends Skill {
  readonly name = 'analytics';

  @hook({ lifecycle: 'on_connection', priority: 10 })
  async trackRequest(data: HookData, ctx: Context) {
    note(ctx, 'analytics.trackRequest', { stream: data.stream });
    return data;
  }

  @hook({ lifecycle: 'on_message', priority: 20 })
  async analyzeMessage(data: HookData, ctx: Context) {
    const latest = data.messages?.at(-1);
    note(ctx, 'analytics.analyzeMessage', { role: latest?.role });
    return data;
  }

  @hook({ lifecycle: 'on_chunk', priority: 30 })
  async monitorStreaming(data: HookData, ctx: Context) {
    const size = (data.content ?? '').length;
    ctx.state.chunk_chars = Number(ctx.state.chunk_chars ?? 0) + size;
    return data;
  }
}

class SecuritySkill extends Skill {
  readonly name = 'security';

  @hook({ lifecycle: 'before_toolcall', priority: 1 })
  async validateSecurity(data, ctx) {
    const toolName = data.tool_call?.function?.name;
    note(ctx, 'security.validateSecurity', { tool: toolName });
    if (this.isDangerous(toolName)) {
      throw new Error(`Tool blocked: ${toolName}`);
    }
    return data;
  }

  private isDangerous(name?: string) {
    return name === 'rm_rf_root';
  }
}

class LoggingSkill extends Skill {
  readonly name = 'logging';

  @hook({ lifecycle: 'before_toolcall', priority: 10 })
  async logToolUsage(data, ctx) {
    this.logTool(ctx, data.tool_call);
    return data;
  }

  private logTool(ctx: Context, call: unknown) {
    note(ctx, 'logging.logToolUsage', { tool: (call as { function?: { name?: string } })?.function?.name });
  }
}

class RequestLogger extends Skill {
  readonly name = 'request-logger';
  private startTime = 0;
  private requestId = '';

  @hook({ lifecycle: 'on_connection' })
  async startLogging(data, ctx) {
    this.startTime = Date.now();
    this.requestId = String(ctx.metadata.completion_id ?? '');
    note(ctx, 'request-logger.startLogging');
    return data;
  }

  @hook({ lifecycle: 'finalize_connection' })
  async endLogging(data, ctx) {
    const seconds = (Date.now() - this.startTime) / 1000;
    note(ctx, 'request-logger.endLogging', {
      seconds,
      usage: data.usage ?? null,
      error: data.error ? { status_code: data.error.status_code, code: data.error.code } : null,
    });
    return data;
  }
}

class ContentFilter extends Skill {
  readonly name = 'content-filter';

  @hook({ lifecycle: 'on_message', priority: 5 })
  async filterInput(data, ctx) {
    const latest = data.messages?.at(-1);
    if (latest?.role === 'user') {
      latest.content = this.filterContent(String(latest.content ?? ''));
    }
    return data;
  }

  @hook({ lifecycle: 'on_chunk', priority: 5 })
  async filterOutput(data, ctx) {
    if (this.isInappropriate(data.content ?? '')) {
      data.chunk.choices[0].delta.content = '[filtered]';
    }
    return data;
  }

  private filterContent(text: string) {
    return text.replace(/\bdarn\b/g, '[filtered]');
  }

  private isInappropriate(text: string) {
    return /\bdarn\b/.test(text);
  }
}

class PerformanceMonitor extends Skill {
  readonly name = 'performance-monitor';
  private timers = new Map<string, { start: number }>();

  @hook({ lifecycle: 'before_toolcall' })
  async startTimer(data, ctx) {
    this.timers.set(String(data.tool_id), { start: Date.now() });
    note(ctx, 'performance-monitor.startTimer', { tool: data.tool_call?.function?.name });
    return data;
  }

  @hook({ lifecycle: 'after_toolcall' })
  async recordDuration(data, ctx) {
    const id = String(data.tool_id);
    const start = this.timers.get(id)?.start ?? Date.now();
    this.timers.delete(id);
    note(ctx, 'performance-monitor.recordDuration', {
      tool: data.tool_call?.function?.name,
      seconds: (Date.now() - start) / 1000,
      result: data.tool_result,
    });
    return data;
  }
}

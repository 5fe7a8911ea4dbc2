/**
 * `hookbus-worker --group NAME ./skills.ts [...] [--concurrency N]`: one replica of a
 * hook-worker group, with the flags and environment of `hookbus worker` (REDIS_URL, else
 * the Redis of a running `hookbus run` from `.hookbus/redis-url`; HOOKBUS_PREFIX;
 * HOOKBUS_SHARDS; HOOKBUS_WORKER_VERSION; the reply size limits; OTEL_*; HOOKBUS_LOG_LEVEL).
 */

import { existsSync, readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { GroupHost } from './host.js';
import { loadSkills, SpecError } from './loadSkills.js';
import { instanceName, WorkerReplica } from './replica.js';
import { log } from '../log.js';
import { isCluster } from '../bus/connection.js';
import { configureTracing } from './tracing.js';
import { CONSTANTS } from '../generated/protocol.js';

const USAGE = `usage: hookbus-worker --group NAME FILE[:SkillClass] [FILE ...] [--concurrency N] [--replica NAME]
                      [--claim-idle SECONDS] [--max-deliveries N] [--version VERSION]

Runs one replica of a hookbus worker group hosting every Skill subclass the files export
or define (TypeScript or JavaScript), at VERSION (default: HOOKBUS_WORKER_VERSION, else the
skills' own \`version\`s, else h-<hash of the hooks>). Environment: REDIS_URL (a single
Redis or any node of a Cluster), HOOKBUS_PREFIX (default "hookbus:"), HOOKBUS_SHARDS
(default 1, 12 on a Cluster), HOOKBUS_WORKER_VERSION, HOOKBUS_MAX_HOP_BYTES,
HOOKBUS_MAX_STATE_BYTES, OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_* variables
(tracing), HOOKBUS_LOG_LEVEL.`;

/** How often the worker looks whether the process that started it is gone. */
const PARENT_POLL_MS = 250;

function number(name: string, raw: string | undefined, fallback: number, integer: boolean): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value <= 0 || (integer && !Number.isInteger(value))) {
    throw new SpecError(`--${name} needs a positive ${integer ? 'integer' : 'number'}, not ${JSON.stringify(raw)}`);
  }
  return value;
}

export function redisUrl(): string {
  if (process.env.REDIS_URL) return process.env.REDIS_URL;
  const state = '.hookbus/redis-url';
  if (existsSync(state)) return readFileSync(state, 'utf8').trim();
  throw new SpecError(
    'no Redis to talk to. Set REDIS_URL=redis://host:port/0, or start the whole stack on an embedded Redis with `hookbus run`.',
  );
}

/**
 * Call `exited` once the process that started this one is gone. `npx hookbus-worker` runs
 * node under `sh -c`: a SIGTERM to npx reaches the shell, which dies without passing it on,
 * and node would serve on, re-parented. Its parent changing is that signal, so the worker
 * drains and stops as it does on SIGTERM. (A worker started under pid 1 is never orphaned.)
 */
function watchParent(exited: () => void): NodeJS.Timeout {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid !== parent) exited();
  }, PARENT_POLL_MS);
  timer.unref();
  return timer;
}

export async function main(argv: string[]): Promise<number> {
  let replica: WorkerReplica;
  try {
    const { values, positionals } = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        group: { type: 'string' },
        concurrency: { type: 'string' },
        replica: { type: 'string' },
        'claim-idle': { type: 'string' },
        'max-deliveries': { type: 'string' },
        version: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    });
    if (values.help) {
      process.stdout.write(`${USAGE}\n`);
      return 0;
    }
    if (!values.group) throw new SpecError('--group is required');
    if (!positionals.length) throw new SpecError('name at least one file of skills');
    const skills = await loadSkills(positionals);
    const group = values.group;
    const url = redisUrl();
    const cluster = await isCluster(url);
    replica = new WorkerReplica(new GroupHost(group, skills), {
      redisUrl: url,
      cluster,
      prefix: process.env.HOOKBUS_PREFIX ?? 'hookbus:',
      shards: number('HOOKBUS_SHARDS', process.env.HOOKBUS_SHARDS, cluster ? CONSTANTS.keys.cluster_shards : 1, true),
      concurrency: number('concurrency', values.concurrency, 16, true),
      replica: values.replica ?? instanceName(`worker-${group}`),
      claimIdle: number('claim-idle', values['claim-idle'], 5.0, false),
      maxDeliveries: number('max-deliveries', values['max-deliveries'], 3, true),
      version: values.version,
    });
  } catch (exc) {
    if (exc instanceof SpecError || exc instanceof RangeError || (exc as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      process.stderr.write(`hookbus-worker: ${(exc as Error).message}\n${USAGE}\n`);
      return 2;
    }
    throw exc;
  }
  let orphaned: NodeJS.Timeout | undefined;
  const stopped = new Promise<void>((resolve) => {
    let stopping = false;
    const stop = (signal: string): void => {
      if (stopping) return;
      stopping = true;
      clearInterval(orphaned);
      log('worker_stopping', { signal, replica: replica.replica }, 'info');
      void replica.stop().then(resolve);
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
    orphaned = watchParent(() => stop('parent_exited'));
  });
  configureTracing(replica.replica);
  try {
    await replica.start();
  } catch (exc) {
    process.stderr.write(`hookbus-worker: ${(exc as Error).message}\n`);
    await replica.stop().catch(() => undefined);
    return 1;
  }
  await stopped;
  return 0;
}

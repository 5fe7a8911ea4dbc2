/**
 * The worker's Redis clients, on a single Redis (or Valkey) or a Redis Cluster
 * (hookbus.bus.connection.cluster): REDIS_URL may name any node of a cluster; the worker
 * asks it once (`INFO cluster`) and then builds ioredis Cluster clients, which learn the
 * slot map, follow MOVED/ASK and reload the map after a failover. On a cluster the keys
 * are hash-tagged and sharded (./keys.ts), every command names keys of one slot, and
 * steps that must apply in order ("reply, then ack") go one after another (`inOrder`).
 */

import { Cluster, Redis, ReplyError, type ChainableCommander } from 'ioredis';
import { log } from '../log.js';

/** Whether the server at `url` runs in cluster mode; a server that cannot be asked counts as a single Redis. */
export async function isCluster(url: string): Promise<boolean> {
  const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: 2000 });
  try {
    await probe.connect();
    return /cluster_enabled:1/.test(String(await probe.info('cluster')));
  } catch (exc) {
    log('cluster_detection_failed', { error: (exc as Error).message, assumed: 'single redis' });
    return false;
  } finally {
    probe.disconnect();
  }
}

const retryStrategy = (n: number): number => Math.min(50 * 2 ** n, 1000);

/**
 * A client of the Redis at `url` named `name` (CLIENT LIST). A Cluster client is typed as
 * a Redis: the commands the worker sends have the same shape on both, and what differs
 * (pipelines over several slots) goes through `inOrder`.
 */
export function connect(url: string, name: string, cluster: boolean): Redis {
  if (!cluster) return new Redis(url, { maxRetriesPerRequest: null, retryStrategy, connectionName: name });
  const parsed = new URL(url);
  const client = new Cluster([{ host: parsed.hostname, port: Number(parsed.port || 6379) }], {
    clusterRetryStrategy: retryStrategy,
    retryDelayOnFailover: 100,
    retryDelayOnClusterDown: 100,
    redisOptions: {
      username: decodeURIComponent(parsed.username) || undefined,
      password: decodeURIComponent(parsed.password) || undefined,
      tls: parsed.protocol === 'rediss:' ? {} : undefined,
      connectionName: name,
      maxRetriesPerRequest: null,
    },
  });
  return client as unknown as Redis;
}

/** Whether `client` was built for a Redis Cluster. */
export function clustered(client: Redis): boolean {
  return (client as unknown as { isCluster?: boolean }).isCluster === true;
}

export type Stage = (pipe: ChainableCommander) => void;
export type Results = Array<[Error | null, unknown]>;

/**
 * Run the stages' commands so that each stage is applied before the next begins, and
 * return every command's [error, result] in order. A single Redis runs one pipeline in
 * order: one round trip for all. A Cluster pipeline may only hold keys of one slot, so
 * there each command goes on its own (written without waiting, as ioredis does), and each
 * stage waits for the one before; a stage that met anything but a Redis error reply (a
 * connection lost) throws before the next stage runs, as a failed pipeline does.
 */
export async function inOrder(client: Redis, ...stages: Stage[]): Promise<Results> {
  if (!clustered(client)) {
    const pipe = client.pipeline();
    for (const stage of stages) stage(pipe);
    return ((await pipe.exec()) ?? []) as Results;
  }
  const results: Results = [];
  for (const stage of stages) {
    const settled = await Promise.allSettled(recorded(stage).map(([command, ...args]) => client.call(command, ...args)));
    for (const s of settled) {
      if (s.status === 'rejected' && !(s.reason instanceof ReplyError)) throw s.reason;
      results.push(s.status === 'fulfilled' ? [null, s.value] : [s.reason as Error, null]);
    }
  }
  return results;
}

type Call = [string, ...Array<string | number | Buffer>];

/** The commands a stage queues, as [name, ...args]. */
function recorded(stage: Stage): Call[] {
  const calls: Call[] = [];
  const recorder: ChainableCommander = new Proxy({} as ChainableCommander, {
    get: (_target, name) => (...args: Array<string | number | Buffer>) => {
      calls.push([String(name), ...args]);
      return recorder;
    },
  });
  stage(recorder);
  return calls;
}

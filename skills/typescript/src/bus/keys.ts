/**
 * The Redis key names a worker uses, as hookbus.bus.keys.Keys names them: plain on a single
 * Redis (`hookbus:hooks:<group>`), hash-tagged when the streams are sharded
 * (HOOKBUS_SHARDS > 1) so that each shard's keys share a Redis Cluster slot. The shard
 * tags are computed exactly as hookbus.bus.shards does (CRC16 slots, evenly spaced).
 */

const SLOTS = 16384;
const MAX_SHARDS = 256;
const REGISTRY_TAG = '{registry}';

/** Redis Cluster's key slot: CRC16 (XMODEM) of the hash tag or the whole key, mod 16384. */
export function keySlot(key: string): number {
  const bytes = Buffer.from(key);
  let start = 0;
  let end = bytes.length;
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) {
      start = open + 1;
      end = close;
    }
  }
  let crc = 0;
  for (let i = start; i < end; i++) {
    crc ^= bytes[i]! << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % SLOTS;
}

const tagCache = new Map<number, string[]>();

export function shardTags(count: number): string[] {
  if (!(count >= 1 && count <= MAX_SHARDS) || !Number.isInteger(count)) {
    throw new RangeError(`shard count must be between 1 and ${MAX_SHARDS}, not ${count}`);
  }
  const cached = tagCache.get(count);
  if (cached) return cached;
  const tags: string[] = [];
  for (let shard = 0; shard < count; shard++) {
    const low = Math.ceil((shard * SLOTS) / count);
    const high = Math.ceil(((shard + 1) * SLOTS) / count);
    let attempt = 0;
    for (;;) {
      const slot = keySlot(`s${shard}.${attempt}`);
      if (low <= slot && slot < high) break;
      attempt++;
    }
    tags.push(`s${shard}.${attempt}`);
  }
  tagCache.set(count, tags);
  return tags;
}

/** zlib.crc32, as hookbus.bus.shards.shard_of uses it. */
function crc32(text: string): number {
  let crc = 0xffffffff;
  for (const byte of Buffer.from(text)) {
    crc ^= byte;
    for (let bit = 0; bit < 8; bit++) crc = crc & 1 ? (crc >>> 1) ^ 0xedb88320 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

export class Keys {
  readonly tagged: boolean;

  constructor(readonly prefix = 'hookbus:', readonly shards = 1, readonly cluster = false) {
    shardTags(shards);
    this.tagged = cluster || shards > 1;
  }

  shardOf(name: string): number {
    return this.shards > 1 ? crc32(name) % this.shards : 0;
  }

  private sharded(kind: string, shard: number, name = ''): string {
    const tag = this.tagged ? `:{${shardTags(this.shards)[shard]}}` : '';
    return `${this.prefix}${kind}${tag}${name ? `:${name}` : ''}`;
  }

  private control(name: string): string {
    return this.tagged ? `${this.prefix}${REGISTRY_TAG}:${name}` : `${this.prefix}${name}`;
  }

  hooksShard(group: string, shard: number): string {
    return this.tagged ? this.sharded('hooks', shard, group) : `${this.prefix}hooks:${group}`;
  }

  hookStreams(group: string): string[] {
    return Array.from({ length: this.shards }, (_, s) => this.hooksShard(group, s));
  }

  /** The stream of `group` at `version`: the hops of requests pinned to that version. */
  pinnedHookStreams(group: string, version: string): string[] {
    return this.hookStreams(`${group}@${version}`);
  }

  /** `group`'s observer stream: one entry per request that a group's observers watched. */
  observeShard(group: string, shard: number): string {
    return this.tagged ? this.sharded('observe', shard, group) : `${this.prefix}observe:${group}`;
  }

  observeStreams(group: string): string[] {
    return Array.from({ length: this.shards }, (_, s) => this.observeShard(group, s));
  }

  eventsFor(completionId: string): string {
    return this.sharded('events', this.shardOf(completionId));
  }

  get deadLetter(): string {
    return `${this.prefix}dead-letter`;
  }

  get registry(): string {
    return this.control('registry');
  }

  get registryVersion(): string {
    return this.control('registry:version');
  }

  /** Sorted set: replica name -> last heartbeat (unix seconds). */
  replicas(group: string): string {
    return this.control(`replicas:${group}`);
  }

  /** String: one replica's latest heartbeat record (its protocol version), expiring on its own. */
  replicaHeartbeat(group: string, replica: string): string {
    return this.control(`replica:${group}:${replica}`);
  }

  /** Hash: replica name -> the version it runs and whether it drains (ReplicaInfo JSON). */
  replicaVersions(group: string): string {
    return this.control(`replica-versions:${group}`);
  }

  /** Sorted set: completion id -> when it was pinned to `group` at `version`. */
  serving(group: string, version: string): string {
    return this.control(`serving:${group}@${version}`);
  }
}

"""Everything that touches Redis, in five subpackages and four modules:

- `connection/`: the Redis plumbing (retrying clients, Redis Cluster, the embedded server,
  pipelines, batched appends, shards);
- `wire/`: the versioned envelopes of every stream entry and what they carry;
- `hops/`: a stage's data to a worker group and its reply back;
- `groups/`: membership and recovery (registry, heartbeats, claims, dead letters, trims);
- `store/`: state kept in Redis (journal, sessions, stored responses, response streams,
  the monitor's events);
- `client.py` (HookbusClient), `keys.py` (every key name), `settings.py` (the environment),
  `limits.py` (what one request may hold).
"""

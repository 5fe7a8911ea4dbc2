"""The Redis plumbing: clients that survive restarts, Redis Cluster, the embedded server,
pipelines and batched appends, and which cluster slot a key lands in."""

"""Group membership and recovery: the registry of worker groups and their replicas,
heartbeats and leases, claiming what a dead consumer left pending, dead letters, trimming,
and the background loops every consumer-group member runs."""

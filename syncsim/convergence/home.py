"""Where a replay's authoritative parameters live, which copy ``Replayer.parameters`` returns."""

__all__ = ["SERVER", "REPLICAS", "OUTER", "SHARDS"]

SERVER = "server"       # the parameter servers' (after a push)
REPLICAS = "replicas"   # every replica's, bit-identical after a synchronisation
OUTER = "outer"         # DiLoCo's outer parameters, each fragment's value at its last outer step
SHARDS = "shards"       # the sharded master parameters, worker w owning shard w

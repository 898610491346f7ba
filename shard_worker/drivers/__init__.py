"""The shard worker's drivers: the lifecycle, one reader per stream, the sink task."""

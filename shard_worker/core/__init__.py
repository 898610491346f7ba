"""Pure cores of the shard worker: no I/O, no clock reads."""

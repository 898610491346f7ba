"""The shard worker's adapters: pipes, WebSocket, sinks, logs."""

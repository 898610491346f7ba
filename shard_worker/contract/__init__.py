"""What the supervisor and its children share; imports neither trio-websocket nor the supervisor."""

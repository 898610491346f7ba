"""Pure cores of the supervisor: decisions from observations and ``now``; no I/O, clock or trio."""

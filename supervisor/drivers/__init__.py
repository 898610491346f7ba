"""The supervisor's drivers: trio loops that read the clock, sleep, and call cores and adapters."""

"""Thin adapters of the supervisor: DynamoDB, processes, HTTP, metrics, logs, systemd."""

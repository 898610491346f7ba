"""The lease-store fixtures of the contract tests (tests/helpers/stores.py), for this folder."""

from helpers.stores import backend, make_store  # noqa: F401 (fixtures, found by name)

"""Secrets out of log text: the one redaction both processes use.

The supervisor registers its secrets (``${NAME}`` values, header values) and tells each child
which to redact; both replace them with ``***`` in every line they write. Pure: the callers
keep the set of secrets and pass it in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

REDACTED = "***"


def merge_secrets(known: Iterable[str], more: Iterable[str] = ()) -> tuple[str, ...]:
    """The union, without empty strings, longest first (then by text, so the order is stable):
    "Bearer abc" is replaced before "abc", so no part of either survives."""
    merged = {s for s in (*known, *more) if s}
    return tuple(sorted(merged, key=lambda s: (-len(s), s)))


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret replaced by ``***`` (``secrets`` ordered by ``merge_secrets``)."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def scrub(value: Any, secrets: tuple[str, ...]) -> Any:
    """``value`` with every string in it redacted (dict keys and nested containers too); other
    objects become their redacted ``str``. Lists, tuples and sets come back as lists (JSON)."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {scrub(k, secrets): scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [scrub(v, secrets) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value), secrets)


__all__ = ["REDACTED", "merge_secrets", "redact", "scrub"]

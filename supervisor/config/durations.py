"""Durations in the config file: seconds as a number, or a string with a unit ("250ms", "2m").

Strings are parsed with ``Decimal`` so "0.1s" and "100ms" give the same float, and
``format_duration`` picks a string that parses back to exactly the float it was given.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_UNITS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}
_PATTERN = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h)\s*")
_BARE_NUMBER = re.compile(r"\s*\+?(\d+(?:\.\d*)?|\.\d+)\s*")
_EXPECTED = 'expected a number of seconds or a string like "250ms", "10s", "2m"'


def parse_duration(value: object) -> float:
    """Seconds from an int/float (>= 0) or a string with a unit (ms, s, m, h).

    A bare numeric string is rejected: "10" in a config file is more likely a forgotten
    unit than a deliberate choice of seconds.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{_EXPECTED}; got {value!r}")  # noqa: TRY004 (one error type for callers)
    if isinstance(value, str):
        seconds = _parse_string(value)
    else:
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be a finite number; got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration must not be negative; got {value!r}")
    return seconds


def _parse_string(text: str) -> float:
    match = _PATTERN.fullmatch(text)
    if match is None:
        hint = ""
        if text.strip().startswith("-"):
            hint = " (a duration must not be negative)"
        elif _BARE_NUMBER.fullmatch(text):
            hint = ' (a string needs a unit: "ms", "s", "m" or "h")'
        raise ValueError(f"{_EXPECTED}; got {text!r}{hint}")
    number, unit = match.groups()
    return float(Decimal(number) * _UNITS[unit])


def format_duration(seconds: float) -> str:
    """A compact string that ``parse_duration`` reads back to exactly ``seconds``.

    Whole hours, minutes, seconds or milliseconds use that unit ("2h", "2m", "10s", "250ms");
    other values are written in seconds with the shortest exact decimal ("1.5s").
    """
    if not math.isfinite(seconds):
        raise ValueError(f"cannot format a non-finite duration: {seconds!r}")
    if seconds < 0:
        return "-" + format_duration(-seconds)
    exact = Decimal(repr(float(seconds)))  # shortest decimal that round-trips the float
    if exact == 0:
        return "0s"
    units = ("h", "m", "s") if exact >= 1 else ("ms",)
    for unit in units:
        count = exact / _UNITS[unit]
        candidate = f"{_plain(count)}{unit}"
        if count == count.to_integral_value() and _parse_string(candidate) == seconds:
            return candidate
    return f"{_plain(exact)}s"


def _plain(number: Decimal) -> str:
    """Fixed-point text, never an exponent (the parser does not accept "1e-05")."""
    text = format(number, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text

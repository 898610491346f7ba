import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.config.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("10s", 10.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("0.1s", 0.1),
        ("100ms", 0.1),
        (".5s", 0.5),
        ("0s", 0.0),
        (" 10 s ", 10.0),
    ],
)
def test_parse_string_with_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("value", "seconds"), [(10, 10.0), (0, 0.0), (2.5, 2.5)])
def test_parse_number_is_seconds(value: float, seconds: float) -> None:
    result = parse_duration(value)
    assert result == seconds
    assert isinstance(result, float)


def test_parse_rejects_garbage_with_the_expected_forms() -> None:
    with pytest.raises(ValueError) as info:
        parse_duration("abc")
    assert str(info.value) == (
        'expected a number of seconds or a string like "250ms", "10s", "2m"; got \'abc\''
    )


def test_parse_rejects_bare_numeric_string_and_asks_for_a_unit() -> None:
    with pytest.raises(ValueError, match=r"got '10' \(a string needs a unit"):
        parse_duration("10")


@pytest.mark.parametrize("value", ["10x", "1e3s", "10.s", "s", "", "1.2.3s", "10sec"])
def test_parse_rejects_malformed_strings(value: str) -> None:
    with pytest.raises(ValueError, match="expected a number of seconds"):
        parse_duration(value)


@pytest.mark.parametrize("value", [-1, -0.5, "-1s"])
def test_parse_rejects_negative(value: object) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        parse_duration(value)


@pytest.mark.parametrize("value", [math.inf, math.nan, 10**400])
def test_parse_rejects_non_finite(value: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        parse_duration(value)


@pytest.mark.parametrize("value", [True, None, [1], {"s": 1}])
def test_parse_rejects_other_types(value: object) -> None:
    with pytest.raises(ValueError, match="expected a number of seconds"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (0.1, "100ms"),
        (0.001, "1ms"),
        (1.5, "1.5s"),
        (10, "10s"),
        (90, "90s"),
        (120, "2m"),
        (3600, "1h"),
        (5400, "90m"),
        (0.0015, "0.0015s"),
        (-2.0, "-2s"),
    ],
)
def test_format_is_compact(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_rejects_non_finite() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        format_duration(math.inf)


@given(st.integers(min_value=0, max_value=10**12))
def test_round_trip_of_whole_milliseconds(milliseconds: int) -> None:
    seconds = milliseconds / 1000
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.floats(min_value=0, allow_nan=False, allow_infinity=False))
def test_round_trip_of_any_float(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds

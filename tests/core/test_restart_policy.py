"""Restart backoff on a fake clock, including property tests of its bounds."""

from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.restart_policy import RestartPolicy


def policy(rng=lambda: 1.0, **kw) -> RestartPolicy:
    kw.setdefault("initial", 0.1)
    kw.setdefault("maximum", 30.0)
    kw.setdefault("reset_after", 60.0)
    return RestartPolicy(rng=rng, **kw)


def test_backoff_doubles_up_to_the_maximum():
    pol = policy(max_restarts=100, window=1.0)
    caps = []
    for i in range(12):
        pol.child_started(i * 100.0)
        caps.append(pol.child_crashed(i * 100.0 + 1.0).delay)
    assert caps[:5] == [0.0, 0.1, 0.2, 0.4, 0.8]  # the first restart is immediate
    assert caps[-1] == 30.0


def test_backoff_resets_after_a_healthy_run():
    pol = policy(max_restarts=100)
    for t in range(5):
        pol.child_started(float(t))
        pol.child_crashed(t + 0.5)
    pol.child_started(10.0)
    assert pol.child_crashed(70.0).delay == 0.0  # healthy for reset_after: back to immediate
    pol.child_started(70.5)
    assert pol.child_crashed(71.0).delay == 0.1


def test_too_many_crashes_in_the_window_is_a_crash_loop():
    pol = policy(max_restarts=5, window=60.0)
    results = []
    for t in range(6):
        pol.child_started(t * 10.0)
        results.append(pol.child_crashed(t * 10.0 + 1).crash_loop)
    assert results == [False] * 5 + [True]


def test_crashes_outside_the_window_are_forgotten():
    pol = policy(max_restarts=2, window=10.0)
    for t in (0.0, 20.0, 40.0, 60.0):
        pol.child_started(t)
        assert not pol.child_crashed(t + 1).crash_loop


@given(
    draws=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=40),
    initial=st.floats(0.001, 5.0),
    maximum=st.floats(5.0, 120.0),
)
def test_full_jitter_delay_is_always_within_zero_and_the_cap(draws, initial, maximum):
    it = iter(draws)
    pol = RestartPolicy(initial, maximum, 60.0, max_restarts=1000, rng=lambda: next(it))
    pol.child_started(0.0)
    assert pol.child_crashed(0.5).delay == 0.0  # the first restart draws nothing
    for i, draw in enumerate(draws, start=1):
        pol.child_started(float(i))
        delay = pol.child_crashed(i + 0.5).delay
        cap = min(maximum, initial * 2 ** (i - 1))
        assert 0.0 <= delay <= cap
        assert abs(delay - draw * cap) < 1e-9

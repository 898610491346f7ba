"""Two independent requests side by side (``drivers.together.both``)."""

import pytest
import trio

from supervisor.adapters.lease_store.base import StoreUnavailable
from supervisor.drivers.together import both


async def slow(value: object, delay: float) -> object:
    await trio.sleep(delay)
    return value


async def test_both_results_arrive_after_the_slower_not_the_sum(autojump_clock):
    started = trio.current_time()
    assert await both(lambda: slow("a", 2.0), lambda: slow("b", 3.0)) == ("a", "b")
    assert trio.current_time() - started == pytest.approx(3.0)


async def test_an_error_is_raised_as_itself_and_cancels_the_other(autojump_clock):
    async def fails() -> None:
        await trio.sleep(1.0)
        raise StoreUnavailable("throttled")

    started = trio.current_time()
    with pytest.raises(StoreUnavailable, match="throttled"):
        await both(fails, lambda: slow("b", 30.0))
    assert trio.current_time() - started == pytest.approx(1.0)


async def test_two_errors_raise_one_with_the_other_noted():
    async def fails(text: str) -> None:
        raise StoreUnavailable(text)

    with pytest.raises(StoreUnavailable) as raised:
        await both(lambda: fails("one"), lambda: fails("two"))
    other = "two" if str(raised.value) == "one" else "one"
    assert len(raised.value.__notes__) == 1 and other in raised.value.__notes__[0]


async def test_cancellation_passes_through(autojump_clock):
    with trio.move_on_after(1.0) as scope:
        await both(lambda: slow("a", 5.0), lambda: slow("b", 5.0))
    assert scope.cancelled_caught

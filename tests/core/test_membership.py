"""The membership view by generation (protocol 2), on plain values."""

import hypothesis.strategies as st
from hypothesis import given

from supervisor.core.items import WorkerItem
from supervisor.core.membership import (
    Member,
    MembershipView,
    RosterView,
    announces,
    deal_excess,
    view_targets,
)


def view(*members, generation=3, at=0.0):
    return MembershipView.read(generation, members, at)


def test_the_view_is_reread_only_when_the_generation_moved_it_is_incomplete_or_old():
    current = view(Member("a", "running", mgen=3), Member("b", "running", mgen=1))
    assert not current.needs_reread(3, now=10.0, refresh=300.0)
    assert current.needs_reread(4, now=10.0, refresh=300.0)
    assert current.needs_reread(3, now=300.0, refresh=300.0)
    lagging = view(Member("a", "running", mgen=2), generation=3)  # change 3 not in the index yet
    assert not lagging.complete() and lagging.needs_reread(3, now=1.0, refresh=300.0)
    again = MembershipView.read(3, lagging.members, 2.0, previous=lagging)
    assert not again.needs_reread(3, now=3.0, refresh=300.0)  # a bump with no item: taken


def test_members_take_shards_the_ring_holds_everyone_who_may_still_own_some():
    members = view(
        Member("d", "draining"),
        Member("a", "running"),
        Member("x", "dead"),
        Member("o", "orphaned"),
        Member("s", "stopped"),
    )
    assert members.live() == ("a",)
    assert members.on_ring() == ("a", "d", "o")


def test_a_change_of_state_or_cap_is_announced_a_change_of_held_is_not():
    member = Member("a", "running", max_shards=5, held=3)
    assert announces(None, member)
    assert announces(member, Member("a", "draining", max_shards=5, held=3))
    assert announces(member, Member("a", "running", max_shards=6, held=3))
    assert not announces(member, Member("a", "running", max_shards=5, held=9))


def test_targets_come_from_the_view_and_the_caps_it_lists():
    members = view(Member("a", "running", max_shards=2), Member("b", "running"))
    assert view_targets(members, 10, "c", 0) == {"a": 2, "b": 4, "c": 4}


def test_a_join_is_filled_by_name_from_the_excess_of_those_over_target():
    targets = {"a": 3, "b": 3, "c": 3, "new": 3}
    held = {"a": 4, "b": 4, "c": 4}
    assert deal_excess(targets, held) == {"a": ("new",), "b": ("new",), "c": ("new",)}


def test_a_draining_worker_hands_everything_to_the_short_members():
    targets = {"a": 3, "b": 3}
    assert deal_excess(targets, {"a": 2, "b": 2, "gone": 2}) == {"gone": ("a", "b")}
    assert deal_excess(targets, {"a": 3, "b": 3, "gone": 1}) == {"gone": ("",)}


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 30), min_size=1))
def test_dealing_never_overfills_a_member_and_names_one_successor_per_shed_shard(held):
    live = sorted(held)[: max(1, len(held) - 1)]  # one worker may be leaving
    targets = view_targets(
        view(*(Member(w, "running") for w in live)), sum(held.values()), live[0], 0
    )
    dealt = deal_excess(targets, held)
    for worker, names in dealt.items():
        assert len(names) == held[worker] - targets.get(worker, 0)
    named = [name for names in dealt.values() for name in names if name]
    for worker in targets:
        after = min(held.get(worker, 0), targets[worker]) + named.count(worker)
        assert after <= targets[worker]
    # Every shard the fleet sheds finds a short member when the totals match.
    assert "" not in [name for names in dealt.values() for name in names]


def worker(worker_id, state="running", counter=0, **more):
    return WorkerItem(worker_id, "s", counter, state, 0.0, 0.0, **more)


def test_protocol_1s_table_is_read_in_full_only_when_its_members_may_have_changed():
    roster = RosterView.full(7, ["a", "b"], [worker("b"), worker("a")], at=0.0)
    assert [w.id for w in roster.workers] == ["a", "b"]
    assert not roster.needs_full(7, ["b", "a"], now=299.0, refresh=300.0)
    assert roster.needs_full(8, ["a", "b"], now=1.0, refresh=300.0)  # announced
    assert roster.needs_full(7, ["a", "b", "c"], now=1.0, refresh=300.0)  # an older joiner
    assert roster.needs_full(7, ["a", "b"], now=300.0, refresh=300.0)  # the backstop
    unknown = RosterView.full(-1, ["a"], [worker("a")], at=0.0)  # the first read
    assert unknown.needs_full(0, ["a"], now=1.0, refresh=300.0)


def test_a_partial_read_updates_the_view_and_shows_what_nobody_announced():
    roster = RosterView.full(1, ["a", "b", "c"], [worker("a"), worker("b"), worker("c")], 0.0)
    fresh = [worker("a", counter=5), worker("b", "draining", counter=9), worker("z")]
    assert roster.unannounced(fresh) == ("b",)  # a heartbeat is not a change; z is unknown
    assert roster.unannounced([worker("c", standbys=("s1",))]) == ("c",)
    updated = roster.updated(fresh)
    assert [(w.id, w.counter, w.state) for w in updated.workers] == [
        ("a", 5, "running"),
        ("b", 9, "draining"),
        ("c", 0, "running"),
    ]
    gone = roster.updated([worker("a", "dead"), worker("b", "stopped"), worker("c", "orphaned")])
    assert gone.on_ring() == ("c",)

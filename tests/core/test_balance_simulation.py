"""Balancing, proven on a deterministic model of the fleet: ``plan_round`` and nothing else.

The model (pure: no store, no trio, no clock, no processes):

* The table is a dict shard -> ``ShardItem`` (owner, epoch) plus the worker items. A take is a
  conditional write: it lands only if the shard still shows the owner and epoch the taker
  observed, and then raises the epoch by one. A release removes the owner and keeps the epoch.
* Time advances by ``RECONCILE`` (2 s) per round. ``DURATION`` (the lease, 10 s) is also
  ``min_dwell``, as in the daemon, so a dwell or a death takes 5 rounds to become visible.
* At the start of every round each running worker heartbeats (counter + 1), so nobody looks dead
  unless it left. Then every running worker, in a seeded random order, observes the table *as it
  is at its turn*, runs ``plan_round``, and applies its decisions at once. Applying sheds at once
  is the one simplification: a graceful release takes well under a second in reality, far less
  than a reconcile interval. Two harsher variants: ``concurrent=True`` gives every worker the
  snapshot from the start of the round (all scan, then all write, so takes may race and fail
  their condition); ``slow_handoff=True`` releases a shed shard only during the shedder's next
  turn, as the daemon does when a graceful stop outlasts a reconcile interval.
* A graceful leave releases all the leaver's shards and marks it stopped (dead at once to its
  peers). A death freezes its worker item: the peers see its counter stand still and declare it
  dead after ``DURATION``; its shards stay owned by it until then. A restart is a death followed
  at once by a new incarnation with the same id.
* Every worker knows every worker's ``max_shards`` (``peer_caps``); uncapped unless a test says.

A change is *visible* in the first round in which every worker's view agrees with it: at once
for a join or a leave, after ``DURATION`` for a death (``DEATH_ROUNDS``). A *move* is a take of
a shard that had another owner before (release + take, or a dead owner's shard).
"""

from __future__ import annotations

import random
from collections import Counter

import attrs
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from supervisor.core.items import ShardItem, WorkerItem
from supervisor.core.lease import PeerTracker
from supervisor.core.planner import Plan, fair_targets, plan_round

DURATION = 10.0
RECONCILE = 2.0
MIN_DWELL = DURATION
DWELL_ROUNDS = int(MIN_DWELL / RECONCILE)
DEATH_ROUNDS = int(DURATION / RECONCILE)  # rounds until peers see a dead worker as dead
BOUND = 5  # rounds from a visible membership change to balance


@attrs.define
class Worker:
    id: str
    tracker: PeerTracker = attrs.field(factory=lambda: PeerTracker(DURATION))
    held: dict[str, int] = attrs.field(factory=dict)
    held_since: dict[str, float] = attrs.field(factory=dict)
    recently_shed: dict[str, float] = attrs.field(factory=dict)
    leaving: set[str] = attrs.field(factory=set)  # shed, release still under way (slow hand-off)


@attrs.define
class Activity:
    """What happened in some rounds: takes and sheds per shard, moves, failed conditions."""

    takes: Counter[str] = attrs.field(factory=Counter)
    sheds: Counter[str] = attrs.field(factory=Counter)
    moves: int = 0
    conflicts: int = 0
    lost: int = 0

    @property
    def changes(self) -> int:
        return sum(self.takes.values()) + sum(self.sheds.values()) + self.lost

    def add(self, other: Activity) -> None:
        self.takes.update(other.takes)
        self.sheds.update(other.sheds)
        self.moves += other.moves
        self.conflicts += other.conflicts
        self.lost += other.lost


@attrs.define
class Fleet:
    rng: random.Random
    shards: dict[str, ShardItem]
    items: dict[str, WorkerItem] = attrs.field(factory=dict)
    running: dict[str, Worker] = attrs.field(factory=dict)
    caps: dict[str, int] = attrs.field(factory=dict)
    previous_owner: dict[str, str] = attrs.field(factory=dict)
    now: float = 0.0
    concurrent: bool = False
    slow_handoff: bool = False
    activity: Activity = attrs.field(factory=Activity)

    @classmethod
    def new(cls, shard_count: int, seed: int, **model: bool) -> Fleet:
        shards = {f"shard-{i:04d}": ShardItem(f"shard-{i:04d}", "", 0) for i in range(shard_count)}
        return cls(random.Random(seed), shards, **model)

    # --- membership ----------------------------------------------------------------------------

    def join(self, wid: str, cap: int = 0) -> None:
        """A new process (or a new incarnation of an old id): counter above any earlier one."""
        old = self.items.get(wid)
        self.items[wid] = WorkerItem(wid, "s", (old.counter + 1) if old else 0, "running", 0, 0)
        self.running[wid] = Worker(wid)
        self.caps[wid] = cap

    def leave(self, wid: str) -> None:
        worker = self.running.pop(wid)
        for sid in list(worker.held):
            self._release(worker, sid)
        self.items[wid] = attrs.evolve(self.items[wid], state="stopped")

    def die(self, wid: str) -> None:
        del self.running[wid]  # the item stays "running" with a counter that stands still

    def live(self) -> list[str]:
        return sorted(self.running)

    def has_dead_items(self) -> bool:
        """Items of workers that died without a clean exit (still "running", counter frozen)."""
        return any(i.state == "running" and i.id not in self.running for i in self.items.values())

    def new_id(self) -> str:
        while (wid := f"w{self.rng.randrange(16**6):06x}") in self.items:
            pass
        return wid

    # --- rounds --------------------------------------------------------------------------------

    def round(self) -> Activity:
        """One reconcile round of every running worker; returns what it did (also summed up)."""
        self.now += RECONCILE
        for wid in self.running:
            item = self.items[wid]
            self.items[wid] = attrs.evolve(item, counter=item.counter + 1)
        done = Activity()
        snapshot = list(self.shards.values())
        for wid in self.rng.sample(sorted(self.running), len(self.running)):
            seen = snapshot if self.concurrent else list(self.shards.values())
            self._turn(self.running[wid], seen, done)
        self.activity.add(done)
        return done

    def _turn(self, worker: Worker, seen: list[ShardItem], done: Activity) -> None:
        finished = set(worker.leaving)  # slow hand-offs end during our next turn
        worker.tracker.observe(self.items.values(), self.now)
        plan = plan_round(
            me=worker.id,
            held=dict(worker.held),
            held_since=dict(worker.held_since),
            shards=seen,
            configured=self.shards,
            tracker=worker.tracker,
            now=self.now,
            accepting=True,
            min_dwell=MIN_DWELL,
            recently_shed=worker.recently_shed,
            max_shards=self.caps[worker.id],
            peer_caps=self.caps,
        )
        _assert_takes_were_takeable(worker, plan, {s.id: s for s in seen}, self.now)
        shed = set(plan.shed)  # a hand-off under way is chosen again before any other shard
        assert finished <= shed or shed <= finished, (finished, shed)
        self._apply(worker, plan, done)
        for sid in finished:
            self._release(worker, sid)

    def _apply(self, worker: Worker, plan: Plan, done: Activity) -> None:
        for sid in plan.lost:
            done.lost += 1
            del worker.held[sid]
        for sid in plan.shed:
            worker.recently_shed[sid] = self.now  # as the daemon does on every shed decision
            if sid in worker.leaving:
                continue
            done.sheds[sid] += 1
            if self.slow_handoff:
                worker.leaving.add(sid)
            else:
                self._release(worker, sid)
        for take in plan.take:
            current = self.shards[take.shard_id]
            if (current.owner, current.epoch) != (take.expected_owner, take.expected_epoch):
                done.conflicts += 1  # the conditional write fails: someone was faster
                continue
            self.shards[take.shard_id] = ShardItem(take.shard_id, worker.id, current.epoch + 1)
            worker.held[take.shard_id] = current.epoch + 1
            worker.held_since[take.shard_id] = self.now
            previous = self.previous_owner.get(take.shard_id, worker.id)
            done.moves += previous != worker.id
            self.previous_owner[take.shard_id] = worker.id
            done.takes[take.shard_id] += 1

    def _release(self, worker: Worker, sid: str) -> None:
        current = self.shards[sid]
        assert (current.owner, current.epoch) == (worker.id, worker.held[sid])
        self.shards[sid] = ShardItem(sid, "", current.epoch)
        del worker.held[sid]
        worker.leaving.discard(sid)

    # --- judging -------------------------------------------------------------------------------

    def loads(self) -> dict[str, int]:
        counts = dict.fromkeys(self.running, 0)
        for item in self.shards.values():
            if item.owner in counts:
                counts[item.owner] += 1
        return counts

    def targets(self) -> dict[str, int]:
        return fair_targets(len(self.shards), self.running, self.caps)

    def balanced(self) -> bool:
        """Every worker at its target (so max - min <= 1 uncapped), runs exactly what it owns."""
        loads = self.loads()
        for wid, worker in self.running.items():
            owned = {s.id for s in self.shards.values() if s.owner == wid}
            assert set(worker.held) <= owned, "a worker runs a shard the table gives to another"
            if set(worker.held) != owned or worker.leaving:
                return False
        return loads == self.targets()

    def missing_per_worker(self) -> int:
        """The fewest moves any plan could make: what the live workers lack of their targets."""
        loads = self.loads()
        return sum(max(0, target - loads[w]) for w, target in self.targets().items())


def _assert_takes_were_takeable(
    worker: Worker, plan: Plan, seen: dict[str, ShardItem], now: float
) -> None:
    """A worker takes only what it observed as unowned, its own, or a dead worker's."""
    for take in plan.take:
        item = seen[take.shard_id]
        assert (take.expected_owner, take.expected_epoch) == (item.owner, item.epoch)
        assert item.owner in ("", worker.id) or worker.tracker.is_dead(item.owner, now)
    assert plan.lost == (), f"{worker.id} lost {plan.lost}"


# --- running a change ------------------------------------------------------------------------


@attrs.frozen
class Outcome:
    visible_after: int  # the round (1 = the first after the change) in which it became visible
    rounds: int  # rounds from the change becoming visible to balance (1 = that very round)
    moves: int
    minimum_moves: int
    activity: Activity


def converge(fleet: Fleet, *, visible_after: int = 1, limit: int = 40) -> Outcome:
    """Run rounds until balanced; count from the round in which the change became visible.

    Call it right after the change: the fewest possible moves are judged on the fleet as the
    change left it (a dead or departed worker's shards count as free).
    """
    fleet.activity = Activity()
    minimum = fleet.missing_per_worker()
    for n in range(1, limit + 1):
        fleet.round()
        if n >= visible_after and fleet.balanced():
            rounds = n - visible_after + 1
            return Outcome(visible_after, rounds, fleet.activity.moves, minimum, fleet.activity)
    raise AssertionError(f"not balanced after {limit} rounds: {sorted(fleet.loads().values())}")


def assert_stable(fleet: Fleet, rounds: int) -> None:
    """Balanced stays balanced: no take, no shed, no loss for ``rounds`` rounds."""
    for _ in range(rounds):
        done = fleet.round()
        assert done.changes == 0, f"flapping: {done}"
        assert fleet.balanced()


def assert_once_per_shard(outcome: Outcome) -> None:
    activity = outcome.activity
    assert max(activity.takes.values(), default=0) <= 1, activity.takes.most_common(3)
    assert max(activity.sheds.values(), default=0) <= 1, activity.sheds.most_common(3)
    assert outcome.moves == outcome.minimum_moves


def balanced_fleet(shards: int, workers: int, seed: int, **model: bool) -> Fleet:
    """Started together, balanced, and every shard dwelt: the state before a change."""
    fleet = Fleet.new(shards, seed, **model)
    for _ in range(workers):
        fleet.join(fleet.new_id())
    converge(fleet)
    for _ in range(DWELL_ROUNDS):
        fleet.round()
    assert fleet.balanced()
    return fleet


# --- the fleet of the brief: 1,000 shards over 20 workers -------------------------------------

SHARDS, WORKERS = 1000, 20
SEEDS = [1, 2, 3]
MODES = [pytest.param(False, id="sequential"), pytest.param(True, id="concurrent")]


def report(name: str, seed: int, concurrent: bool, outcome: Outcome) -> None:
    mode = "concurrent" if concurrent else "sequential"
    print(
        f"\n[balance] {name:<10} {mode:<10} seed={seed}: visible in round "
        f"{outcome.visible_after}, balanced within {outcome.rounds} round(s); "
        f"moves={outcome.moves} (minimum {outcome.minimum_moves}), "
        f"max takes/shard={max(outcome.activity.takes.values(), default=0)}, "
        f"failed conditional takes={outcome.activity.conflicts}"
    )


@pytest.mark.parametrize("concurrent", MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_cold_start_of_twenty_workers(seed: int, concurrent: bool) -> None:
    fleet = Fleet.new(SHARDS, seed, concurrent=concurrent)
    for _ in range(WORKERS):
        fleet.join(fleet.new_id())
    outcome = converge(fleet)
    report("cold start", seed, concurrent, outcome)
    assert outcome.rounds <= BOUND
    assert max(outcome.activity.takes.values()) == 1 and len(outcome.activity.takes) == SHARDS
    assert outcome.moves == 0
    loads = fleet.loads().values()
    assert max(loads) - min(loads) <= 1 and sum(loads) == SHARDS
    if seed == SEEDS[0] and not concurrent:
        assert_stable(fleet, 50)


@pytest.mark.parametrize("concurrent", MODES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("change", ["join", "leave", "die"])
def test_one_membership_change_moves_each_shard_at_most_once(
    change: str, seed: int, concurrent: bool
) -> None:
    fleet = balanced_fleet(SHARDS, WORKERS, seed, concurrent=concurrent)
    visible_after = 1
    if change == "join":
        fleet.join(fleet.new_id())
    elif change == "leave":
        fleet.leave(fleet.rng.choice(fleet.live()))
    else:
        fleet.die(fleet.rng.choice(fleet.live()))
        visible_after = DEATH_ROUNDS
    outcome = converge(fleet, visible_after=visible_after)
    report(change, seed, concurrent, outcome)
    assert outcome.rounds <= BOUND
    assert_once_per_shard(outcome)
    loads = fleet.loads().values()
    assert max(loads) - min(loads) <= 1 and sum(loads) == SHARDS
    if seed == SEEDS[0] and not concurrent:
        assert_stable(fleet, 50)


def test_a_death_moves_nothing_before_the_lease_duration_has_passed() -> None:
    fleet = balanced_fleet(200, 8, seed=7)
    fleet.die(fleet.live()[0])
    for _ in range(DEATH_ROUNDS - 1):
        assert fleet.round().changes == 0
    assert fleet.round().moves == 25
    assert fleet.balanced()


def test_a_restarted_worker_takes_back_its_own_shards_and_nothing_moves() -> None:
    fleet = balanced_fleet(200, 8, seed=8)
    wid = fleet.live()[3]
    mine = {s.id for s in fleet.shards.values() if s.owner == wid}
    fleet.die(wid)
    fleet.join(wid)  # same id, new incarnation, before anyone declared it dead
    outcome = converge(fleet)
    assert outcome.rounds == 1 and outcome.moves == 0
    assert set(fleet.running[wid].held) == mine


def test_a_capped_workers_excess_goes_to_the_others() -> None:
    fleet = Fleet.new(100, seed=9)
    for i in range(5):
        fleet.join(f"w{i}", cap=10 if i == 0 else 0)
    converge(fleet)
    assert fleet.loads() == {"w0": 10, "w1": 23, "w2": 23, "w3": 22, "w4": 22}
    assert_stable(fleet, 10)


def test_beyond_the_total_capacity_shards_stay_unowned_without_flapping() -> None:
    fleet = Fleet.new(100, seed=10)
    for i in range(5):
        fleet.join(f"w{i}", cap=15)
    converge(fleet)
    assert set(fleet.loads().values()) == {15}
    assert sum(1 for s in fleet.shards.values() if not s.owner) == 25
    assert_stable(fleet, 10)


# --- random membership sequences, smaller fleets -------------------------------------------------

EVENTS = st.sampled_from(["join", "leave", "die", "restart"])


def _apply_event(fleet: Fleet, event: str) -> int:
    """Apply one change; returns the round in which every worker can see it as it is.

    A new process sees the item of a worker that died earlier for the first time: it counts that
    worker alive for one more ``DURATION`` (it cannot know how long the counter stood still), so
    its view agrees with its peers' only after ``DEATH_ROUNDS`` + 1 rounds.
    """
    if event == "join" or len(fleet.running) < 2:
        fleet.join(fleet.new_id())
        return DEATH_ROUNDS + 1 if fleet.has_dead_items() else 1
    wid = fleet.rng.choice(fleet.live())
    if event == "leave":
        fleet.leave(wid)
    elif event == "die":
        fleet.die(wid)
        return DEATH_ROUNDS
    else:
        fleet.die(wid)
        fleet.join(wid)
        return DEATH_ROUNDS + 1 if fleet.has_dead_items() else 1
    return 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shards=st.integers(1, 60),
    workers=st.integers(1, 6),
    events=st.lists(EVENTS, min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
    concurrent=st.booleans(),
    slow_handoff=st.booleans(),
)
def test_every_settled_membership_change_balances_fast_and_moves_each_shard_once(
    shards: int, workers: int, events: list[str], seed: int, concurrent: bool, slow_handoff: bool
) -> None:
    fleet = balanced_fleet(shards, workers, seed, concurrent=concurrent, slow_handoff=slow_handoff)
    for event in events:
        outcome = converge(fleet, visible_after=_apply_event(fleet, event))
        assert outcome.rounds <= BOUND, (event, outcome.rounds)
        assert_once_per_shard(outcome)
        assert_stable(fleet, DWELL_ROUNDS)  # and every shard dwelt before the next change


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shards=st.integers(1, 60),
    workers=st.integers(1, 6),
    events=st.lists(st.tuples(EVENTS, st.integers(0, 3)), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
    concurrent=st.booleans(),
    slow_handoff=st.booleans(),
)
def test_changes_in_quick_succession_still_settle_and_then_stay_put(
    shards: int,
    workers: int,
    events: list[tuple[str, int]],
    seed: int,
    concurrent: bool,
    slow_handoff: bool,
) -> None:
    """Changes that overlap may cost extra moves, but never flapping or a stuck shard.

    Bound: every view agrees once the last death is visible to the newest worker; then a shard
    taken just before must dwell, and one shed just before cools, each for ``MIN_DWELL``.
    """
    fleet = balanced_fleet(shards, workers, seed, concurrent=concurrent, slow_handoff=slow_handoff)
    for event, gap in events:
        _apply_event(fleet, event)
        for _ in range(gap):
            fleet.round()
    for _ in range(DEATH_ROUNDS + 1):
        fleet.round()
    converge(fleet, limit=2 * DWELL_ROUNDS + BOUND)
    assert_stable(fleet, 2 * DWELL_ROUNDS)

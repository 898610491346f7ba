"""Protocol 2's round as pure decisions: what a worker reads, and what it makes of it.

On protocol 2 a round does not scan the table: it plans on what concerns this worker (the
shards it runs, the ones addressed to it, a page of its vacant buckets while it is short, and,
now and then, a strongly consistent read of the items it owns) with the fleet's shard count for
the targets (docs/lease-protocol.md, *Fleets of a thousand workers*). The hand-off poll reads
only ``successor = <me>``. Each function here decides one of those steps from values; the
daemon (``drivers.daemon``) reads, writes and keeps time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import attrs

from shard_worker.contract.table import HANDOFF_REQUESTED
from supervisor.core.items import HandoffRequest, ShardItem
from supervisor.core.membership import Member, deal_excess
from supervisor.core.planner import Take, fair_targets

OWN_BACKSTOP = 600.0  # s: the consistent read of our own items when nothing asked for one


@attrs.frozen
class PollActions:
    """What one read of ``successor = <me>`` asks of us."""

    takes: tuple[Take, ...] = ()  # released to us by name, or routed to us after a death
    requests: tuple[HandoffRequest, ...] = ()  # make-before-break requests naming us
    unknown: tuple[str, ...] = ()  # listed for us, but we know no definition of it yet


def poll_actions(
    addressed: Iterable[ShardItem], me: str, runnable: Collection[str], busy: Collection[str]
) -> PollActions:
    """Unowned and named for us: released to us (a drain, a rebalance, ``release``). Owned and
    named for us without a hand-off stage: routed to us by its dead owner's watcher, taken
    from that owner at that epoch (the take is conditional on both). Owned with the stage
    ``requested``: a make-before-break request. ``busy``: shards we run or are taking."""
    takes, requests, unknown = [], [], []
    for item in sorted(addressed, key=lambda i: i.id):
        if item.successor != me or item.id in busy:
            continue
        if item.id not in runnable:
            unknown.append(item.id)
        elif not item.owner:
            takes.append(Take(item.id, "", item.epoch))
        elif not item.handoff_stage:
            takes.append(Take(item.id, item.owner, item.epoch))
        elif item.handoff_stage == HANDOFF_REQUESTED:
            requests.append(HandoffRequest(item.id, item.epoch, me))
    return PollActions(tuple(takes), tuple(requests), tuple(unknown))


def own_read_due(
    *,
    read_at: float | None,
    mailbox_seen: int,
    mailbox: int,
    now: float,
    backstop: float,
    unheld: bool = False,
) -> bool:
    """Whether this round reads our own items strongly consistently: at the first round, when
    someone poked our mailbox (``release``, ``shards remove``: the marks are on the shard
    items, which no index projects), every ``backstop`` (a write we missed), and while the
    last read showed items of ours that we do not run (an earlier incarnation's, retaken
    after the warm-up: the round must keep seeing them)."""
    return read_at is None or unheld or mailbox != mailbox_seen or now - read_at >= backstop


def shard_view(
    *,
    vacant: Iterable[ShardItem],
    addressed: Iterable[ShardItem],
    held: Mapping[str, int],
    me: str,
    consistent: Mapping[str, ShardItem],
) -> tuple[ShardItem, ...]:
    """The shards a round plans on, one item each: what a strongly consistent read showed,
    else our own holding (we run it at that epoch), else the index's listing."""
    items: dict[str, ShardItem] = {item.id: item for item in vacant}
    items.update((item.id, item) for item in addressed)
    items.update((sid, ShardItem(sid, me, epoch)) for sid, epoch in held.items())
    items.update(consistent)
    return tuple(items[sid] for sid in sorted(items))


def targets(
    members: Sequence[Member], shard_count: int, me: str, my_cap: int, accepting: bool
) -> dict[str, int]:
    """The fleet's fair shares from the member list (us among them while we accept)."""
    live = {m.id for m in members if m.state == "running" and m.id != me}
    if accepting:
        live.add(me)
    caps = {m.id: m.max_shards for m in members if m.max_shards}
    return fair_targets(shard_count, live, {**caps, me: my_cap})


def successors(
    shard_ids: Sequence[str],
    *,
    me: str,
    members: Sequence[Member],
    holding: int,
    shard_count: int,
    accepting: bool,
    my_cap: int,
    prefer: Callable[[str], Sequence[str]] = lambda shard: (),
) -> dict[str, str]:
    """A successor per shard we hand off, dealt from the members' counts
    (``membership.deal_excess``) so that no two shedders overfill one worker; a shard the
    short members cannot absorb gets none (it goes back to its vacant bucket). Each shard
    goes to one of its ``prefer`` (its standbys, nearest first) when one was dealt, or has
    room under its share (it then takes the place of the last name dealt): the hand-off is
    a promotion, no spawn and no connect. Never past a share: a promotion that overfilled a
    worker would only be moved again."""
    shares = targets(members, shard_count, me, my_cap, accepting)
    held = {m.id: m.held for m in members if m.state in ("running", "draining")}
    held[me] = holding
    names = deal_excess(shares, held).get(me, ())
    slots = [names[i] if i < len(names) else "" for i in range(len(shard_ids))]
    chosen: dict[str, str] = {}
    for sid in shard_ids:  # a standby among the names dealt: swapped in
        match = next((w for w in prefer(sid) if w and w in slots), "")
        if match:
            slots.remove(match)
            chosen[sid] = match
    given = Counter(chosen.values()) + Counter(n for n in slots if n)
    for sid in shard_ids:  # a standby with room under its share: it takes a dealt name's place
        match = next(
            (
                w
                for w in prefer(sid)
                if w
                and w != me
                and sid not in chosen
                and held.get(w, 0) + given[w] < shares.get(w, 0)
            ),
            "",
        )
        if not match:
            continue
        dealt = [i for i, n in enumerate(slots) if n]
        if dealt:
            given[slots.pop(dealt[-1])] -= 1
        else:
            slots.pop()
        given[match] += 1
        chosen[sid] = match
    for sid in shard_ids:
        if sid not in chosen:
            name = slots.pop(0)
            if name:
                chosen[sid] = name
    return {sid: chosen[sid] for sid in shard_ids if sid in chosen}


__all__ = [
    "OWN_BACKSTOP",
    "PollActions",
    "own_read_due",
    "poll_actions",
    "shard_view",
    "successors",
    "targets",
]

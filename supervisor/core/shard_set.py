"""Which shards this worker may run, and what a reload of the config file changes about it.

A worker runs the config file's ``[[shards]]`` plus the shards registered in the table
(``shardvisor shards add``: a spec in the item, not retired). SIGHUP re-reads the file: only
the shard list applies at once (``diff_reload``); other sections wait for a restart. Pure: the
driver decodes specs (that is config parsing) and logs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import attrs

from supervisor.config.model import Config, ShardConfig
from supervisor.core.items import ShardItem
from supervisor.core.runner_state import HeldShard

# Config sections a reload does not apply: they take effect at the next start.
RESTART_ONLY_SECTIONS = ("worker", "dynamodb", "lease", "supervisor", "standby", "sink", "log")


@attrs.frozen
class ReloadDiff:
    """What a re-read config file changes. Ids sorted."""

    shards: Mapping[str, ShardConfig]  # the new file's shards, by id
    added: tuple[str, ...] = ()  # registered in the table, then taken like any other
    removed: tuple[str, ...] = ()  # handed off by the next round (no longer runnable)
    changed: tuple[str, ...] = ()  # restarted: released to ourselves, taken at a new epoch
    # Shards whose streams stay but whose ``standbys`` changed: applied without a restart.
    restandby: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()  # sections that changed but apply at the next restart

    @property
    def unchanged(self) -> int:
        return len(self.shards) - len(self.added) - len(self.changed)


def diff_reload(running: Config, shards: Mapping[str, ShardConfig], reloaded: Config) -> ReloadDiff:
    """``reloaded`` against what runs: ``running`` is the config the process started with
    (its other sections are what apply), ``shards`` the file's shards as of the last reload."""
    ignored = tuple(
        name for name in RESTART_ONLY_SECTIONS if getattr(reloaded, name) != getattr(running, name)
    )
    new = {shard.id: shard for shard in reloaded.shards}
    return ReloadDiff(
        shards=new,
        added=tuple(sorted(new.keys() - shards.keys())),
        removed=tuple(sorted(shards.keys() - new.keys())),
        changed=tuple(
            sorted(
                sid for sid in new.keys() & shards.keys() if new[sid].streams != shards[sid].streams
            )
        ),
        restandby=tuple(
            sorted(
                sid
                for sid in new.keys() & shards.keys()
                if new[sid].streams == shards[sid].streams and new[sid] != shards[sid]
            )
        ),
        ignored=ignored,
    )


def restart_on_reload(changed: Iterable[str], held: Mapping[str, HeldShard]) -> list[str]:
    """The changed shards this worker runs and has not been told to hand off already."""
    return [sid for sid in changed if sid in held and held[sid].state.serving]


def registered_candidates(
    configured: Collection[str], items: Iterable[ShardItem]
) -> list[ShardItem]:
    """Table items this worker may run beside the file's shards: a spec, not retired, and an
    id the file does not define (the file wins). The driver decodes each item's spec."""
    return [
        item for item in items if item.spec and not item.retired_at and item.id not in configured
    ]


@attrs.define
class SpecReports:
    """An invalid registered spec is reported once, and again only when it changes."""

    _reported: dict[str, str] = attrs.field(factory=dict)

    def first_time(self, shard_id: str, spec: str) -> bool:
        if self._reported.get(shard_id) == spec:
            return False
        self._reported[shard_id] = spec
        return True


__all__ = [
    "RESTART_ONLY_SECTIONS",
    "ReloadDiff",
    "SpecReports",
    "diff_reload",
    "registered_candidates",
    "restart_on_reload",
]

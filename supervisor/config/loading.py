"""Read the TOML config file into a ``Config``, reporting every problem at once.

Each problem is one line that starts with its key path (``shards[1].streams[0].url: ...``), so
an operator can fix the whole file in one pass instead of meeting one error per restart.

``parse_config`` validates a parsed document and has no side effect: it opens no file and
imports nothing. ``load_config`` reads the file, validates it, then runs the checks against
this host (``environment``: the CA bundle parses, the handler imports) and reports their
problems with the others.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from shard_worker.contract.pipe import StreamSpec
from supervisor.adapters.logs import Redactor
from supervisor.config.checks import Check, Invalid, show
from supervisor.config.environment import environment_problems
from supervisor.config.model import Config, ShardConfig, WebSocketConfig
from supervisor.config.rules import CONFIG_RULES, RULES, stream_liveness
from supervisor.config.schema import (
    SECTIONS,
    SHARD,
    STREAM,
    TOP_LEVEL,
    Key,
    Problem,
    Table,
    key_path,
)
from supervisor.config.substitution import Substitution

_UNIQUE_STREAMS_WHY = (
    "; stream ids must be unique across all shards because sink files and checkpoints"
    " are keyed by stream"
)
_SECTION_OF = re.compile(r"[A-Za-z0-9_-]+")


class ConfigError(Exception):
    """The config is unusable. ``problems`` has one line per problem; ``source`` names the file."""

    def __init__(self, problems: Sequence[str], source: str = "<config>") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__("\n".join(self.problems))


# --- Public API --------------------------------------------------------------------------------


def parse_config(
    data: dict[str, Any],
    source: str = "<config>",
    *,
    environ: Mapping[str, str] | None = None,
    substitute: bool = True,
) -> Config:
    """Validate the parsed TOML document; raise ConfigError listing every problem found.

    ``${NAME}`` in a string is replaced from ``environ`` (default: os.environ); with
    ``substitute`` false a reference is a problem (definitions stored in the table).
    Side-effect free: the files and code the config names are not looked at (see
    ``load_document``)."""
    return _validate(data, source, environ, substitute=substitute).result()


def load_document(
    data: dict[str, Any], source: str = "<config>", *, environ: Mapping[str, str] | None = None
) -> Config:
    """What ``load_config`` does once the file is read: ``parse_config``, then the checks
    against this host (``environment``), every problem of both in one ConfigError."""
    validation = _validate(data, source, environ, substitute=True)
    return validation.also(environment_problems(validation.config)).result()


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> Config:
    """Read, validate and check a TOML config file; every failure is a ConfigError naming the
    file."""
    name = os.fspath(path)
    return load_document(read_document(path), name, environ=environ)


def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML document in the file; ConfigError if it cannot be read or is not TOML."""
    name = os.fspath(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{name}: cannot read: {exc.strerror or exc}"], name) from exc
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{name}: not UTF-8 text: {exc}"], name) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{name}: invalid TOML: {exc}"], name) from exc


# --- One validation: the config as far as it is valid, and every problem -----------------------


@attrs.frozen
class _Validation:
    config: Config  # each key that failed stands at its default
    source: str
    substitution: Substitution
    problems: tuple[str, ...]

    def also(self, problems: Iterable[Problem]) -> _Validation:
        more = tuple(f"{path}: {message}" for path, message in problems)
        return attrs.evolve(self, problems=self.problems + more)

    def result(self) -> Config:
        """The config, or ConfigError: substitution problems first, then the others in the
        order of the file's sections, without those a failed substitution explains."""
        substitution = self.substitution
        ordered = sorted(self.problems, key=_section_index)  # stable: each section's order stays
        problems = substitution.problems + [p for p in ordered if not substitution.caused(p)]
        if problems:
            # A problem may quote a bad value: never one that came from the environment.
            redactor = Redactor()
            redactor.add(substitution.secrets)
            raise ConfigError([redactor(problem) for problem in problems], self.source)
        return self.config


def _section_index(problem: str) -> int:
    match = _SECTION_OF.match(problem)
    name = match.group(0) if match else ""
    return TOP_LEVEL.index(name) if name in TOP_LEVEL else -1


def _validate(
    data: dict[str, Any],
    source: str,
    environ: Mapping[str, str] | None,
    *,
    substitute: bool,
) -> _Validation:
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: expected a table of sections, got {show(data)}"], source)
    substitution = Substitution(
        (os.environ if environ is None else environ) if substitute else None
    )
    data = substitution.walk(data, "")
    reader = _Reader()
    reader.table(data, "", TOP_LEVEL)
    sections: dict[str, Any] = {}
    for name, table in SECTIONS.items():
        values, bad = reader.section(data, name, table.keys)
        sections[name] = table.model(**values)
        rule = RULES.get(name)
        for path, message in rule(sections, bad) if rule else ():
            reader.report(path, message)
    config = Config(
        **sections,
        shards=_shards(reader, data, sections["websocket"]),
        templates=tuple(sorted(substitution.templates)),
        secrets=frozenset(substitution.secrets),
    )
    failed = {problem.split(":", 1)[0] for problem in reader.problems}
    for whole_rule in CONFIG_RULES:
        for path, message in whole_rule(config):
            if path not in failed:
                reader.report(path, message)
    return _Validation(config, source, substitution, tuple(reader.problems))


# --- Walking the tables --------------------------------------------------------------------------


def _unknown_key(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (known keys: {', '.join(known)})"


@attrs.define
class _Reader:
    """Collects problems while the tables are read, so all of them are reported together."""

    problems: list[str] = attrs.Factory(list)

    def report(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def table(self, value: object, path: str, known: Sequence[str]) -> dict[str, Any] | None:
        """The table at ``path`` with unknown keys reported, or None if it is not a table."""
        if not isinstance(value, dict):
            self.report(path, f"expected a table, got {show(value)}")
            return None
        for key in value:
            if key not in known:
                self.report(key_path(path, key), _unknown_key(key, known))
        return value

    def fields(
        self, table: Mapping[str, Any], path: str, keys: Iterable[Key]
    ) -> tuple[dict[str, Any], set[str]]:
        """Checked values of the keys present, and the names of the keys that failed."""
        values: dict[str, Any] = {}
        bad: set[str] = set()
        for key in keys:
            if key.name in table:
                try:
                    values[key.name] = key.check(table[key.name])
                except Invalid as exc:
                    self.report(f"{path}.{key.name}", str(exc))
                    bad.add(key.name)
        return values, bad

    def section(
        self, data: Mapping[str, Any], name: str, keys: Mapping[str, Key]
    ) -> tuple[dict[str, Any], set[str]]:
        table = self.table(data.get(name, {}), name, list(keys))
        return self.fields(table or {}, name, keys.values())


def _entry(
    reader: _Reader, item: object, path: str, schema: Table, seen: dict[str, str], what: str
) -> tuple[str | None, dict[str, Any], dict[str, Any]] | None:
    """A [[shards]] or [[shards.streams]] table: its checked id (None if missing, bad or a
    duplicate), its other checked values, and the table; None if it is not a table."""
    table = reader.table(item, path, schema.known)
    if table is None:
        return None
    ident = _unique_id(reader, table, path, seen, what, schema.keys["id"].check)
    others = [key for key in schema.keys.values() if key.name != "id"]
    values, _ = reader.fields(table, path, others)
    return ident, values, table


def _unique_id(
    reader: _Reader,
    table: Mapping[str, Any],
    path: str,
    seen: dict[str, str],
    what: str,
    check: Check,
) -> str | None:
    """The checked id of a shard or stream; ``seen`` maps ids to where they first appeared."""
    key = f"{path}.id"
    if "id" not in table:
        reader.report(key, f"missing (every {what} needs an id)")
        return None
    try:
        ident: str = check(table["id"])
    except Invalid as exc:
        reader.report(key, str(exc))
        return None
    if ident in seen:
        why = _UNIQUE_STREAMS_WHY if what == "stream" else ""
        reader.report(key, f"duplicate {what} id {ident!r} (also at {seen[ident]}){why}")
        return None
    seen[ident] = key
    return ident


def _array_of_tables(reader: _Reader, value: object, path: str, header: str) -> list[Any] | None:
    if not isinstance(value, list):
        reader.report(path, f"expected an array of tables ({header}), got {show(value)}")
        return None
    return value


def _streams(
    reader: _Reader,
    shard: Mapping[str, Any],
    path: str,
    seen: dict[str, str],
    websocket: WebSocketConfig,
) -> tuple[StreamSpec, ...]:
    items = _array_of_tables(
        reader, shard.get("streams", []), f"{path}.streams", "[[shards.streams]]"
    )
    if items is None:
        return ()
    if not items:
        reader.report(f"{path}.streams", "a shard needs at least one [[shards.streams]] table")
    streams = []
    for index, item in enumerate(items):
        stream_path = f"{path}.streams[{index}]"
        entry = _entry(reader, item, stream_path, STREAM, seen, "stream")
        if entry is None:
            continue
        ident, values, table = entry
        for problem_path, message in stream_liveness(stream_path, values, websocket):
            reader.report(problem_path, message)
        if "url" not in table:
            reader.report(
                f"{stream_path}.url", "missing (every stream needs a ws:// or wss:// url)"
            )
        if ident is not None and "url" in values:
            streams.append(StreamSpec(id=ident, **values))
    return tuple(streams)


def _shards(
    reader: _Reader, data: Mapping[str, Any], websocket: WebSocketConfig
) -> tuple[ShardConfig, ...]:
    shard_ids: dict[str, str] = {}
    stream_ids: dict[str, str] = {}
    shards = []
    items = _array_of_tables(reader, data.get("shards", []), "shards", "[[shards]]")
    for index, item in enumerate(items or []):
        path = f"shards[{index}]"
        entry = _entry(reader, item, path, SHARD, shard_ids, "shard")
        if entry is None:
            continue
        ident, values, table = entry
        streams = _streams(reader, table, path, stream_ids, websocket)
        if ident is not None:
            shards.append(ShardConfig(id=ident, streams=streams, **values))
    return tuple(shards)

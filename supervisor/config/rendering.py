"""``render_config``: the effective config as TOML (``shardvisor check-config`` prints it).

Every key of the schema with its value, defaults filled in, readable by ``loading`` again. A
value that came from ``${NAME}`` is shown as written, so a secret is never printed; a literal
``${`` in a plain value is written ``$${`` so that it reads back as itself.
"""

from __future__ import annotations

import json

import attrs

from supervisor.config.durations import format_duration
from supervisor.config.model import Config
from supervisor.config.schema import SECTIONS, SHARD, STREAM, Table, key_path
from supervisor.config.substitution import escape


def render_config(config: Config) -> str:
    """The effective config as TOML: every key, defaults filled in, readable by parse_config.
    A value that came from ``${NAME}`` is shown as written: a secret is never printed."""
    render = _Renderer(dict(config.templates))
    lines = ["# Effective shardvisor configuration (every key, defaults filled in).", ""]
    for name, table in SECTIONS.items():
        lines += render.table(f"[{name}]", table, getattr(config, name), name)
    if not config.shards:
        lines.append("# No [[shards]]: shards may be registered later.")
    for i, shard in enumerate(config.shards):
        lines += render.table("[[shards]]", SHARD, shard, f"shards[{i}]")
        for j, stream in enumerate(shard.streams):
            path = f"shards[{i}].streams[{j}]"
            lines += render.table("[[shards.streams]]", STREAM, stream, path)
    return "\n".join(lines).rstrip("\n") + "\n"


def _toml_value(value: object) -> str:
    """TOML text for a model value; every float in the model is a duration in seconds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        value = format_duration(value)
    # JSON escapes are TOML escapes, except that TOML also forbids a raw DEL character.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


@attrs.define
class _Renderer:
    """Model values as TOML, with every substituted value shown as written (``${NAME}``)."""

    templates: dict[str, str]

    def table(self, header: str, schema: Table, obj: object, path: str) -> list[str]:
        """The keys of ``schema`` (nested arrays of tables are rendered by the caller)."""
        lines = [header]
        for name in schema.keys:
            value, at = getattr(obj, name), key_path(path, name)
            if value is None:  # unset, and TOML has no null: a shard's standbys, a stream's
                continue  # [websocket] keys (the section's apply)
            text = self.pairs(value, at) if name == "headers" else self.value(value, at)
            lines.append(f"{name} = {text}")
        return [*lines, ""]

    def value(self, value: object, path: str) -> str:
        if path in self.templates:
            return _toml_value(self.templates[path])
        if isinstance(value, str):
            return _toml_value(escape(value))
        if isinstance(value, tuple):
            return "[" + ", ".join(self.value(v, f"{path}[{i}]") for i, v in enumerate(value)) + "]"
        return _toml_value(value)

    def pairs(self, pairs: tuple[tuple[str, str], ...], path: str) -> str:
        """(name, value) pairs as an inline table."""
        items = [f"{key_path('', k)} = {self.value(v, key_path(path, k))}" for k, v in pairs]
        return "{ " + ", ".join(items) + " }" if items else "{}"

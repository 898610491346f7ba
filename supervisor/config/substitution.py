"""``${NAME}`` in any string of the document, replaced from the environment at load time.

``$${`` is a literal ``${``. The substituted values are secrets: ``Substitution`` remembers the
text as written (``render_config`` prints that, never the value) and the values themselves
(``Config.secrets``, which the logs redact). A value it could not substitute keeps its
``${NAME}``, and the problems that only follow from that are not reported (``caused``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from supervisor.config.schema import key_path

# "$${" is a literal "${"; "${NAME}" a reference; any other "${" is a mistake.
_REFERENCE = re.compile(r"\$\$\{|\$\{(?:([A-Za-z_][A-Za-z0-9_]*)\})?")


@attrs.define
class Substitution:
    """Replaces ``${NAME}`` in every string of the document, remembering what it did."""

    environ: Mapping[str, str] | None  # None: references are refused (registered shards)
    problems: list[str] = attrs.Factory(list)
    failed: set[str] = attrs.Factory(set)  # key paths whose value could not be substituted
    templates: list[tuple[str, str]] = attrs.Factory(list)  # (key path, text as written)
    secrets: set[str] = attrs.Factory(set)

    def caused(self, problem: str) -> bool:
        """Whether a validation problem only follows from a failed substitution (a value
        still holding its ``${NAME}``): reporting it too would be noise."""
        path = problem.split(": ", 1)[0]
        return any(f == path or f.startswith((f"{path}.", f"{path}[")) for f in self.failed)

    def walk(self, value: Any, path: str) -> Any:
        """``value`` with every string in it substituted; ``path`` names it in problems."""
        if isinstance(value, str):
            return self.text(value, path)
        if isinstance(value, dict):
            return {k: self.walk(v, key_path(path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value

    def text(self, text: str, path: str) -> str:
        if "${" not in text:
            return text
        if self.environ is None:
            self.failed.add(path)
            self.problems.append(
                f"{path}: ${{...}} is substituted only in config files: a registered shard is"
                " stored in the table as given, where `shards list` shows it; define a shard"
                " that needs a secret in [[shards]] of the config file"
            )
            return text
        used: list[str] = []
        problems: list[str] = []
        result = _REFERENCE.sub(lambda m: self._replace(m, path, used, problems), text)
        if problems:
            self.failed.add(path)
            self.problems += dict.fromkeys(problems)  # once each, in order
        if used:
            self.templates.append((path, text))
            self.secrets.update(v for v in used if v)
        return result

    def _replace(
        self, match: re.Match[str], path: str, used: list[str], problems: list[str]
    ) -> str:
        name = match.group(1)
        if match.group(0) == "$${":
            return "${"
        if name is None:
            problems.append(
                f'{path}: "${{" must start a reference like ${{NAME}} (NAME: letters,'
                " digits, _; not starting with a digit); write $${ for a literal ${"
            )
        elif self.environ is not None and name in self.environ:
            used.append(self.environ[name])
            return self.environ[name]
        else:
            problems.append(f"{path}: environment variable {name} is not set")
        return match.group(0)


def escape(text: str) -> str:
    """The inverse of substitution for a plain value: a literal ``${`` is written ``$${``."""
    return text.replace("${", "$${")

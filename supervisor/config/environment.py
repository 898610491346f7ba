"""Checks of a valid config against this host: the files it names exist and parse, the code it
names imports. These have side effects (opening files, importing the user's module), so they
are not part of validation (``loading.parse_config``): ``loading.load_config`` runs them after
it, and reports their problems with the others, one line each, naming the key.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from supervisor.config.model import Config
from supervisor.config.schema import Problem


def environment_problems(config: Config) -> list[Problem]:
    """What this host lacks to run ``config``, as (key path, message)."""
    problems = []
    if config.tls.ca_bundle and (problem := ca_bundle_problem(config.tls.ca_bundle)):
        problems.append(("tls.ca_bundle", problem))
    handler = config.sink.handler if config.sink.kind == "handler" else ""
    if handler and (problem := handler_problem(handler)):
        problems.append(("sink.handler", problem))
    return problems


def ca_bundle_problem(path: str) -> str | None:
    """Why ``path`` is not a readable PEM file of CA certificates (None: it is one). The
    children load it at each connection; found here, a typo is a config error at start."""
    try:
        with Path(path).open("rb"):
            pass
        ssl.create_default_context(cafile=path)
    except IsADirectoryError:
        return f"{path!r} is a directory, not a PEM file of CA certificates"
    except FileNotFoundError:
        return f"no such file {path!r} (a PEM file of CA certificates)"
    except PermissionError:
        return f"{path!r} is not readable by this user"
    except (ssl.SSLError, OSError, ValueError) as exc:
        return f"{path!r} is not a PEM file of CA certificates: {exc}"
    return None


def handler_problem(reference: str) -> str | None:
    """Why ``reference`` cannot be loaded in this interpreter (None: it can). The children
    import it the same way, so a typo is a config error at start, not a crash loop."""
    # Imported here: the sink adapters (trio and the batch machinery) are the child's, and only
    # a config with a handler sink needs them.
    from shard_worker.adapters.sinks.handler import load_handler

    try:
        load_handler(reference)
    except ValueError as exc:
        return str(exc)
    return None

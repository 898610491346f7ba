"""The configuration file, one module per concern (import each name from its owner):

- ``model``: the frozen attrs classes; each key's default and check (``setting``).
- ``schema``: the keys of each table, read from the model (and the checks of the two contract
  classes, ``SinkSpec`` and ``StreamSpec``, which the child imports without the supervisor).
- ``checks``: pure value checks; ``rules``: rules between keys; ``durations``: "250ms" and back.
- ``substitution``: ``${NAME}`` from the environment, remembering templates and secrets.
- ``loading``: ``ConfigError``, ``parse_config`` (no side effect), ``load_config``.
- ``environment``: the checks against this host that ``load_config`` runs after validation.
- ``rendering``: ``render_config``, what ``shardvisor check-config`` prints.
- ``shard_spec``: shards registered in the table, validated like ``[[shards]]``.
"""

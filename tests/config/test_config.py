import json
import re
import tomllib
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_worker.contract.pipe import SinkSpec, StreamSpec
from supervisor.config.loading import ConfigError, load_config, load_document, parse_config
from supervisor.config.model import (
    Config,
    DynamoConfig,
    LeaseConfig,
    LogConfig,
    ShardConfig,
    SupervisorConfig,
    WorkerConfig,
)
from supervisor.config.rendering import render_config
from supervisor.config.shard_spec import decode_spec, encode_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "conf" / "shardvisor.example.toml"

SHARD = """
[[shards]]
id = "s1"
[[shards.streams]]
id = "a"
url = "ws://feed.example/a?after={after}"
"""


def problems_of(text: str) -> list[str]:
    """What load_config reports for a file holding ``text``: validation and the checks
    against this host (a handler that does not import)."""
    with pytest.raises(ConfigError) as info:
        load_document(tomllib.loads(text))
    assert info.value.problems, "a ConfigError must carry at least one problem"
    return info.value.problems


def only_problem(text: str) -> str:
    problems = problems_of(text)
    assert len(problems) == 1, problems
    return problems[0]


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text))


# --- Defaults, the example file, accepted forms -------------------------------------------------


def test_empty_file_gives_the_defaults() -> None:
    assert parse("") == Config()


def test_example_file_loads_with_defaults_and_two_shards() -> None:
    config = load_config(EXAMPLE)
    assert attrs.evolve(config, shards=()) == Config()

    def stream(ident: str) -> StreamSpec:
        url = f"ws://127.0.0.1:9000/feed/{ident}?after={{after}}"
        return StreamSpec(id=ident, url=url, sequence="seq")

    assert config.shards == (
        ShardConfig(id="s1", streams=(stream("s1-a"), stream("s1-b"))),
        ShardConfig(id="s2", streams=(stream("s2-a"),)),
    )


def test_example_file_uses_every_key() -> None:
    assert _keys(tomllib.loads(EXAMPLE.read_text())) == _keys(
        tomllib.loads(render_config(Config()))
    )


def _keys(document: dict) -> set[str]:
    """Every section.key path, ignoring the shards (rendered only when there are some)."""
    return {
        f"{name}.{key}" for name, table in document.items() if name != "shards" for key in table
    }


def test_every_section_and_value() -> None:
    config = parse(
        """
        [worker]
        id = "w-1:a.b_c"
        [dynamodb]
        table = "my.table-1"
        region = "eu-west-1"
        endpoint_url = "http://127.0.0.1:8000"
        create_table = false
        [lease]
        duration = 30
        heartbeat_interval = "5s"
        reconcile_interval = 7.5
        safety_margin = "4s"
        [supervisor]
        shutdown_timeout = "1m"
        checkpoint_interval = "250ms"
        restart_backoff_initial = 1
        restart_backoff_max = "1h"
        restart_reset_after = "90s"
        [sink]
        kind = "jsonl"
        path = "/data/{worker}/{shard}/{stream}-{epoch}.jsonl"
        fsync = true
        [log]
        level = "debug"
        [[shards]]
        id = "btc:usd"
        [[shards.streams]]
        id = "btc.trades"
        url = "wss://x.example/{shard}/{stream}?after={after}&e={epoch}&w={worker}"
        sequence = "meta.seq_no"
        subscribe = '{"op": "subscribe", "args": ["{stream}"]}'
        """
    )
    assert config == Config(
        worker=WorkerConfig(id="w-1:a.b_c"),
        dynamodb=DynamoConfig(
            table="my.table-1",
            region="eu-west-1",
            endpoint_url="http://127.0.0.1:8000",
            create_table=False,
        ),
        lease=LeaseConfig(
            duration=30.0, heartbeat_interval=5.0, reconcile_interval=7.5, safety_margin=4.0
        ),
        supervisor=SupervisorConfig(
            shutdown_timeout=60.0,
            checkpoint_interval=0.25,
            restart_backoff_initial=1.0,
            restart_backoff_max=3600.0,
            restart_reset_after=90.0,
        ),
        sink=SinkSpec(path="/data/{worker}/{shard}/{stream}-{epoch}.jsonl", fsync=True),
        log=LogConfig(level="debug"),
        shards=(
            ShardConfig(
                id="btc:usd",
                streams=(
                    StreamSpec(
                        id="btc.trades",
                        url="wss://x.example/{shard}/{stream}?after={after}&e={epoch}&w={worker}",
                        sequence="meta.seq_no",
                        subscribe='{"op": "subscribe", "args": ["{stream}"]}',
                    ),
                ),
            ),
        ),
    )


def test_zero_shards_is_valid() -> None:
    assert parse('[worker]\nid = "w1"').shards == ()


def test_edge_values_are_accepted() -> None:
    config = parse(
        """
        [lease]
        duration = "9s"
        heartbeat_interval = "3s"
        reconcile_interval = "9s"
        safety_margin = "5.999s"
        [supervisor]
        restart_backoff_initial = "30s"
        restart_backoff_max = "30s"
        """
    )
    assert config.lease.heartbeat_interval == 3.0
    assert config.lease.safety_margin == 5.999


# --- One rule, one problem line -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[lease]\nduration = "10s"\nheartbeat_interval = "5s"',
            "lease.heartbeat_interval: must be at most lease.duration / 3"
            " (got 5s with duration 10s)",
        ),
        (
            '[lease]\nreconcile_interval = "20s"',
            "lease.reconcile_interval: must be at most lease.duration (got 20s with duration 10s)",
        ),
        (
            '[lease]\nsafety_margin = "8s"',
            "lease.safety_margin: must be less than lease.duration - lease.heartbeat_interval"
            " (got 8s with duration 10s and heartbeat_interval 2s)",
        ),
        (
            "[lease]\nsafety_margin = -1",
            "lease.safety_margin: a duration must not be negative; got -1",
        ),
        (
            '[supervisor]\nrestart_backoff_initial = "1m"',
            "supervisor.restart_backoff_initial: must be at most supervisor.restart_backoff_max"
            " (got 1m with restart_backoff_max 30s)",
        ),
        (
            "[supervisor]\ncheckpoint_interval = true",
            "supervisor.checkpoint_interval: expected a duration (number of seconds or a string"
            ' like "250ms", "10s", "2m"), got true',
        ),
        (
            '[supervisor]\ncheckpoint_interval = "abc"',
            'supervisor.checkpoint_interval: expected a number of seconds or a string like "250ms",'
            ' "10s", "2m"; got \'abc\'',
        ),
        (
            '[lease]\nduration = "10"',
            'lease.duration: expected a number of seconds or a string like "250ms", "10s", "2m";'
            ' got \'10\' (a string needs a unit: "ms", "s", "m" or "h")',
        ),
        (
            '[sink]\nkind = "parquet"',
            "sink.kind: must be one of jsonl, stdout, kinesis, sqs, handler (got 'parquet')",
        ),
        ('[sink]\npath = ""', "sink.path: must not be empty"),
        (
            '[sink]\npath = "out/{stream}.{epoch}.{date}.jsonl"',
            "sink.path: unknown placeholder {date} (allowed: {shard} {stream} {epoch} {worker})",
        ),
        ('[sink]\nfsync = "yes"', "sink.fsync: expected true or false, got 'yes'"),
        (
            '[log]\nlevel = "verbose"',
            "log.level: must be one of debug, info, warning, error (got 'verbose')",
        ),
        (
            '[log]\nlevel = "INFO"',
            "log.level: must be one of debug, info, warning, error (got 'INFO')",
        ),
        (
            '[dynamodb]\ntable = "ab"',
            "dynamodb.table: must be 3-255 characters of A-Z a-z 0-9 _ . - (got 'ab')",
        ),
        (
            '[dynamodb]\ntable = "my table"',
            "dynamodb.table: must be 3-255 characters of A-Z a-z 0-9 _ . - (got 'my table')",
        ),
        (
            '[dynamodb]\nendpoint_url = "localhost:8000"',
            'dynamodb.endpoint_url: must be "" or start with http:// or https://'
            " (got 'localhost:8000')",
        ),
        ("[dynamodb]\nregion = 5", "dynamodb.region: expected a string, got 5"),
        (
            '[dynamodb]\ncreate_table = "no"',
            "dynamodb.create_table: expected true or false, got 'no'",
        ),
        (
            '[worker]\nid = "my worker"',
            'worker.id: must be "" (derive at start) or 1-128 characters of A-Z a-z 0-9 _ . : -'
            " (got 'my worker')",
        ),
        ("lease = 5", "lease: expected a table, got 5"),
        (
            '[shards]\nid = "s1"',
            "shards: expected an array of tables ([[shards]]), got a table",
        ),
        (
            '[dynamodb]\ntabel = "x"',
            "dynamodb.tabel: unknown key (did you mean 'table'?)",
        ),
        ("[dynamo]\n", "dynamo: unknown key (did you mean 'dynamodb'?)"),
        (
            "[log]\nxyz = 1",
            "log.xyz: unknown key (known keys: level, format)",
        ),
        ('[log]\n"a b" = 1', 'log."a b": unknown key (known keys: level, format)'),
    ],
)
def test_rule(text: str, problem: str) -> None:
    assert only_problem(text) == problem


@pytest.mark.parametrize("key", ["duration", "heartbeat_interval", "reconcile_interval"])
def test_lease_durations_must_be_positive(key: str) -> None:
    assert only_problem(f"[lease]\n{key} = 0") == f"lease.{key}: must be greater than 0 (got 0)"


def test_safety_margin_zero_means_derived() -> None:
    lease = parse("[lease]\nsafety_margin = 0").lease
    assert lease.safety_margin == 0
    assert lease.effective_safety_margin == 2.0


@pytest.mark.parametrize(
    "key",
    [
        "shutdown_timeout",
        "checkpoint_interval",
        "restart_backoff_initial",
        "restart_backoff_max",
        "restart_reset_after",
    ],
)
def test_supervisor_durations_must_be_positive(key: str) -> None:
    problem = only_problem(f'[supervisor]\n{key} = "0ms"')
    assert problem == f"supervisor.{key}: must be greater than 0 (got '0ms')"


def test_worker_id_length_limit() -> None:
    assert parse(f'[worker]\nid = "{"w" * 128}"').worker.id == "w" * 128
    assert only_problem(f'[worker]\nid = "{"w" * 129}"').startswith("worker.id: must be")


def test_table_name_length_limit() -> None:
    assert parse(f'[dynamodb]\ntable = "{"t" * 255}"').dynamodb.table == "t" * 255
    assert only_problem(f'[dynamodb]\ntable = "{"t" * 256}"').startswith("dynamodb.table: must")


@pytest.mark.parametrize("url", ["", "https://dynamodb.local", "http://127.0.0.1:8000"])
def test_endpoint_url_accepts_empty_and_http(url: str) -> None:
    assert parse(f'[dynamodb]\nendpoint_url = "{url}"').dynamodb.endpoint_url == url


@pytest.mark.parametrize(
    ("path", "missing"),
    [
        ("out/{shard}/{stream}.jsonl", "{epoch}"),
        ("out/{shard}.{epoch}.jsonl", "{stream}"),
        ("out/all.jsonl", "{stream} and {epoch}"),
    ],
)
def test_sink_path_needs_stream_and_epoch_and_says_why(path: str, missing: str) -> None:
    problem = only_problem(f'[sink]\npath = "{path}"')
    assert problem.startswith(
        f"sink.path: must contain {{stream}} and {{epoch}} (missing {missing})"
    )
    assert "each stream of each lease epoch needs its own file" in problem


# --- Shards and streams -------------------------------------------------------------------------


def stream_problem(**fields: str) -> str:
    body = "\n".join(f"{key} = {json.dumps(value)}" for key, value in fields.items())
    return only_problem(f'[[shards]]\nid = "s1"\n[[shards.streams]]\n{body}')


def test_stream_url_must_be_websocket() -> None:
    problem = stream_problem(id="a", url="http://x")
    assert problem == "shards[0].streams[0].url: must start with ws:// or wss:// (got 'http://x')"


def test_stream_url_placeholders() -> None:
    problem = stream_problem(id="a", url="ws://x/{foo}?after={after}")
    assert problem == (
        "shards[0].streams[0].url: unknown placeholder {foo}"
        " (allowed: {after} {shard} {stream} {epoch} {worker})"
    )


def test_subscribe_placeholders() -> None:
    problem = stream_problem(id="a", url="ws://x", subscribe="sub {topic}")
    assert problem.startswith("shards[0].streams[0].subscribe: unknown placeholder {topic}")


@pytest.mark.parametrize("sequence", ["a..b", ".seq", "seq.", "meta.0", "my-seq", " seq"])
def test_sequence_must_be_a_dotted_path(sequence: str) -> None:
    problem = stream_problem(id="a", url="ws://x", sequence=sequence)
    assert problem == (
        'shards[0].streams[0].sequence: must be "" or a dotted path of identifiers like "seq"'
        f' or "meta.seq" (got {sequence!r})'
    )


@pytest.mark.parametrize("sequence", ["", "seq", "meta.seq", "_a.b2.C_3"])
def test_sequence_accepts_dotted_identifiers(sequence: str) -> None:
    config = parse(f'{SHARD}sequence = "{sequence}"')
    assert config.shards[0].streams[0].sequence == sequence


def test_stream_needs_an_id_and_a_url() -> None:
    problems = problems_of('[[shards]]\nid = "s1"\n[[shards.streams]]\nsequence = "seq"')
    assert problems == [
        "shards[0].streams[0].id: missing (every stream needs an id)",
        "shards[0].streams[0].url: missing (every stream needs a ws:// or wss:// url)",
    ]


@pytest.mark.parametrize("ident", ["", "a b", "s/1", "é"])
def test_ids_use_a_safe_alphabet(ident: str) -> None:
    problem = only_problem(SHARD.replace('id = "s1"', f'id = "{ident}"'))
    assert problem == (
        f"shards[0].id: must be non-empty and use only A-Z a-z 0-9 _ . : - (got {ident!r})"
    )
    problem = only_problem(SHARD.replace('id = "a"', f'id = "{ident}"'))
    assert problem.startswith("shards[0].streams[0].id: must be non-empty")


def test_shard_needs_an_id() -> None:
    problem = only_problem(SHARD.replace('id = "s1"', ""))
    assert problem == "shards[0].id: missing (every shard needs an id)"


@pytest.mark.parametrize("streams", ["", "streams = []"])
def test_shard_needs_a_stream(streams: str) -> None:
    problem = only_problem(f'[[shards]]\nid = "s1"\n{streams}')
    assert problem == "shards[0].streams: a shard needs at least one [[shards.streams]] table"


def test_duplicate_shard_id_names_both_positions() -> None:
    text = SHARD + SHARD.replace('"a"', '"b"')
    assert only_problem(text) == "shards[1].id: duplicate shard id 's1' (also at shards[0].id)"


def test_duplicate_stream_id_across_shards_names_both_positions_and_why() -> None:
    text = SHARD + SHARD.replace('"s1"', '"s2"')
    assert only_problem(text) == (
        "shards[1].streams[0].id: duplicate stream id 'a' (also at shards[0].streams[0].id);"
        " stream ids must be unique across all shards because sink files and checkpoints are"
        " keyed by stream"
    )


def test_unknown_keys_in_shards_and_streams() -> None:
    text = SHARD.replace('id = "s1"', 'id = "s1"\nname = "x"') + 'sequnce = "seq"'
    assert problems_of(text) == [
        "shards[0].name: unknown key (known keys: id, streams, standbys)",
        "shards[0].streams[0].sequnce: unknown key (did you mean 'sequence'?)",
    ]


def test_shard_entry_must_be_a_table() -> None:
    assert only_problem("shards = [1]") == "shards[0]: expected a table, got 1"


# --- Reporting ----------------------------------------------------------------------------------


def test_all_problems_are_reported_together() -> None:
    text = """
        [dynamodb]
        tabel = "x"
        [lease]
        duration = "10s"
        heartbeat_interval = "5s"
        [log]
        level = "loud"
        [[shards]]
        id = "s1"
        [[shards.streams]]
        id = "a"
        url = "http://x"
        [[shards]]
        id = "s1"
        """
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(text), source="my.toml")
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "dynamodb.tabel",
        "lease.heartbeat_interval",
        "log.level",
        "shards[0].streams[0].url",
        "shards[1].id",
        "shards[1].streams",
    ]
    assert str(info.value) == "\n".join(problems)
    assert info.value.source == "my.toml"
    assert all("\n" not in p for p in problems)


def test_cross_key_rule_is_skipped_when_a_key_is_itself_bad() -> None:
    problem = only_problem('[lease]\nduration = "soon"\nheartbeat_interval = "5s"')
    assert problem.startswith("lease.duration: expected a number of seconds")


def test_non_table_document() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config([], source="x.toml")  # type: ignore[arg-type]
    assert info.value.problems == ["x.toml: expected a table of sections, got an array"]


# --- Files --------------------------------------------------------------------------------------


def test_toml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[lease]\nduration = "10s"\nheartbeat_interval = 2s\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    [problem] = info.value.problems
    assert problem.startswith(f"{path}: invalid TOML: ")
    assert re.search(r"line 3, column \d+", problem)
    assert info.value.source == str(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.problems == [f"{path}: cannot read: No such file or directory"]


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r": cannot read: Is a directory"):
        load_config(tmp_path)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[worker]\nid = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin1\.toml: not UTF-8 text"):
        load_config(path)


def test_load_config_reports_validation_problems(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[lease]\nduration = "-1s"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems[0].startswith("lease.duration: ")
    assert info.value.source == str(path)


# --- render_config ------------------------------------------------------------------------------


def round_trip(config: Config) -> Config:
    return parse_config(tomllib.loads(render_config(config)))


def test_render_defaults_round_trip_and_show_every_key() -> None:
    text = render_config(Config())
    assert round_trip(Config()) == Config()
    document = tomllib.loads(text)
    for section in ("worker", "dynamodb", "lease", "supervisor", "sink", "dead_letter", "log"):
        model = getattr(Config(), section)
        # [sink] is the children's spec but for the dead-letter path, which is [dead_letter]'s.
        fields = {f.name for f in attrs.fields(type(model))} - {"dead_letter"}
        assert set(document[section]) == fields
    assert document["lease"]["duration"] == "10s"
    assert document["supervisor"]["restart_backoff_initial"] == "100ms"


def test_render_example_round_trip() -> None:
    config = load_config(EXAMPLE)
    assert round_trip(config) == config


def test_render_quotes_awkward_strings() -> None:
    subscribe = 'say "hi" \\ back\n\ttab \x7f \x00 \u00e9 \U0001f600 {stream}'
    config = Config(
        shards=(ShardConfig("s", (StreamSpec("a", "ws://x/é?q=\"'", subscribe=subscribe),)),)
    )
    assert round_trip(config) == config


def _ms(low: int, high: int) -> st.SearchStrategy[float]:
    return st.integers(low, high).map(lambda ms: ms / 1000)


@st.composite
def configs(draw: st.DrawFn) -> Config:
    duration_ms = draw(st.integers(3, 10**7))
    heartbeat_ms = draw(st.integers(1, duration_ms // 3))
    lease = LeaseConfig(
        duration=duration_ms / 1000,
        heartbeat_interval=heartbeat_ms / 1000,
        reconcile_interval=draw(_ms(1, duration_ms)),
        safety_margin=draw(_ms(0, duration_ms - heartbeat_ms - 1)),
    )
    initial = draw(_ms(1, 10**6))
    supervisor = SupervisorConfig(
        shutdown_timeout=draw(_ms(1, 10**7)),
        checkpoint_interval=draw(_ms(1, 10**7)),
        restart_backoff_initial=initial,
        restart_backoff_max=draw(_ms(round(initial * 1000), 10**7)),
        restart_reset_after=draw(_ms(1, 10**7)),
    )
    text = st.text().filter(lambda s: not re.search(r"\{[A-Za-z_]\w*\}", s))
    names = st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True)
    stream_ids = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    shards = tuple(
        ShardConfig(
            id=f"shard{index}",
            streams=(StreamSpec(id=ident, url="wss://" + draw(text), subscribe=draw(text)),),
        )
        for index, ident in enumerate(stream_ids)
    )
    return Config(
        worker=WorkerConfig(id=draw(st.from_regex(r"[A-Za-z0-9_.:-]{0,128}", fullmatch=True))),
        dynamodb=DynamoConfig(region=draw(text), create_table=draw(st.booleans())),
        lease=lease,
        supervisor=supervisor,
        sink=SinkSpec(path="x/{stream}/{epoch}" + draw(text), fsync=draw(st.booleans())),
        log=LogConfig(level=draw(st.sampled_from(["debug", "info", "warning", "error"]))),
        shards=shards,
    )


@given(configs())
def test_render_round_trip_property(config: Config) -> None:
    assert round_trip(config) == config


# --- [sink] kinds and [dead_letter] ---------------------------------------------------------------

HANDLER_DIR = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture
def handler_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """conf/ on sys.path, as PYTHONPATH puts it there for a deployed supervisor."""
    monkeypatch.syspath_prepend(str(HANDLER_DIR))


def test_every_sink_kind_with_its_keys(handler_on_path: None) -> None:
    kinesis = parse(
        '[sink]\nkind = "kinesis"\nstream = "records"\npartition_key = "{stream}"\n'
        'region = "eu-west-1"\nendpoint_url = "http://127.0.0.1:5000"\nbatch_max_records = 100\n'
        'batch_max_wait = "50ms"\nmax_attempts = 3\non_failure = "crash"\n'
    ).sink
    assert kinesis == SinkSpec(
        kind="kinesis",
        stream="records",
        partition_key="{stream}",
        region="eu-west-1",
        endpoint_url="http://127.0.0.1:5000",
        batch_max_records=100,
        batch_max_wait=0.05,
        max_attempts=3,
        on_failure="crash",
    )
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/q.fifo"
    assert parse(f'[sink]\nkind = "sqs"\nqueue_url = "{url}"').sink.queue_url == url
    handler = parse('[sink]\nkind = "handler"\nhandler = "example_handler:handle"').sink
    assert handler.handler == "example_handler:handle"
    assert parse('[sink]\nkind = "stdout"\nbatch_max_bytes = 4096').sink.batch_max_bytes == 4096
    rotated = parse("[sink]\nrotate_bytes = 1048576\nmax_message_size = 65536").sink
    assert (rotated.rotate_bytes, rotated.max_message_size) == (1048576, 65536)
    config = parse('[dead_letter]\npath = "dl/{shard}/{stream}-{epoch}.jsonl"')
    assert config.dead_letter.path == "dl/{shard}/{stream}-{epoch}.jsonl"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('kind = "kinesis"', 'sink.stream: missing: kind = "kinesis" needs the stream name or ARN'),
        ('kind = "sqs"', 'sink.queue_url: missing: kind = "sqs" needs the queue URL'),
        (
            'kind = "handler"',
            'sink.handler: missing: kind = "handler" needs "package.module:callable"',
        ),
        (
            'kind = "handler"\nhandler = "no_such_module_xyz:handle"',
            "sink.handler: cannot import module 'no_such_module_xyz': No module named"
            " 'no_such_module_xyz' (is its directory on PYTHONPATH?)",
        ),
        (
            'kind = "handler"\nhandler = "json:no_such_function"',
            "sink.handler: module 'json' has no attribute 'no_such_function'",
        ),
        (
            'kind = "handler"\nhandler = "json:__doc__"',
            "sink.handler: 'json:__doc__' is not callable (it is a str)",
        ),
        (
            'kind = "handler"\nhandler = "my handlers.py"',
            'sink.handler: must be "package.module:callable", like "my_handlers:handle"'
            " (got 'my handlers.py')",
        ),
        (
            'stream = "records"',
            "sink.stream: applies only to kind = kinesis (this sink is 'jsonl'); remove it or"
            " change sink.kind",
        ),
        (
            'kind = "kinesis"\nstream = "s"\nrotate_bytes = 1048576',
            "sink.rotate_bytes: applies only to kind = jsonl (this sink is 'kinesis'); remove it"
            " or change sink.kind",
        ),
        (
            "batch_max_records = 5",
            "sink.batch_max_records: applies only to kind = stdout or kinesis or sqs or handler"
            " (this sink is 'jsonl'); remove it or change sink.kind",
        ),
        (
            'kind = "sqs"\nqueue_url = "https://q"\nbatch_max_records = 11',
            "sink.batch_max_records: must be at most 10 for sqs (got 11)",
        ),
        (
            'kind = "kinesis"\nstream = "s"\nbatch_max_bytes = 6000000',
            "sink.batch_max_bytes: must be at most 5242880 for kinesis (got 6000000)",
        ),
        (
            'kind = "kinesis"\nstream = "s"\npartition_key = "{date}"',
            "sink.partition_key: unknown placeholder {date} (allowed: {shard} {stream} {epoch}"
            " {worker})",
        ),
        (
            'kind = "stdout"\non_failure = "ignore"',
            "sink.on_failure: must be one of dead_letter, crash (got 'ignore')",
        ),
        (
            "rotate_bytes = 1000",
            "sink.rotate_bytes: must be 0 (never rotate) or at least 65536 (got 1000)",
        ),
        (
            "max_message_size = 10",
            "sink.max_message_size: must be from 1024 to 1073741824 (got 10)",
        ),
        (
            'kind = "stdout"\nmax_attempts = 0',
            "sink.max_attempts: must be from 1 to 1000 (got 0)",
        ),
    ],
)
def test_sink_rules(text: str, problem: str) -> None:
    assert only_problem(f"[sink]\n{text}") == problem


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            'path = "out/dead-letter.{epoch}.jsonl"',
            "dead_letter.path: must contain {shard} and {epoch} (missing {shard}): each shard's"
            " lease epoch needs its own file, so two writers never share one",
        ),
        (
            'path = "out/{shard}/{stream}.{epoch}.jsonl"',
            "dead_letter.path: must differ from sink.path",
        ),
        ('path = ""', "dead_letter.path: must not be empty"),
    ],
)
def test_dead_letter_rules(text: str, problem: str) -> None:
    assert only_problem(f"[dead_letter]\n{text}") == problem


def test_a_handler_that_fails_to_import_is_a_config_error(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "broken_handler_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert only_problem('[sink]\nkind = "handler"\nhandler = "broken_handler_mod:handle"') == (
        "sink.handler: importing module 'broken_handler_mod' failed: RuntimeError('boom at import')"
    )


def test_sink_render_round_trip(handler_on_path: None) -> None:
    config = parse(
        '[sink]\nkind = "handler"\nhandler = "example_handler:handle"\nbatch_max_wait = "2s"\n'
        'on_failure = "crash"\n[dead_letter]\npath = "x/{shard}.{epoch}.dl.jsonl"'
    )
    assert round_trip(config) == config


# --- [websocket]: transport, compression, keepalive, idle timeout ---------------------------------


def test_websocket_section_and_a_streams_own_values_reach_the_model() -> None:
    config = parse(
        '[websocket]\ntransport = "trio-websocket"\ncompression = "none"\n'
        'ping_interval = "5s"\nping_timeout = "2s"\nidle_timeout = "30s"\n'
        + SHARD
        + 'idle_timeout = "1500ms"\nping_interval = 0\ncompression = "deflate"\n'
    )
    assert attrs.asdict(config.websocket) == {
        "transport": "trio-websocket",
        "compression": "none",
        "ping_interval": 5.0,
        "ping_timeout": 2.0,
        "idle_timeout": 30.0,
    }
    stream = config.shards[0].streams[0]
    assert (stream.idle_timeout, stream.ping_interval, stream.ping_timeout) == (1.5, 0.0, None)
    assert stream.compression == "deflate"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "[websocket]\nping_timeout = 0\n",
            "websocket.ping_timeout: must be greater than 0 when pings are on (ping_interval ="
            " 20s; set ping_interval = 0 for no pings)",
        ),
        (
            "[websocket]\nidle_timeout = -1\n",
            "websocket.idle_timeout: a duration must not be negative",
        ),
        ('[websocket]\ntransport = "wsproto"\n', "websocket.transport: must be one of"),
        ('[websocket]\ncompression = "gzip"\n', "websocket.compression: must be one of"),
        (
            "[websocket]\nping_interval = 0\nping_timeout = 0\n" + SHARD + 'ping_interval = "1s"\n',
            "shards[0].streams[0].ping_timeout: must be greater than 0 when pings are on",
        ),
        (SHARD + "ping_timeout = 0\n", "shards[0].streams[0].ping_timeout: must be greater"),
        (SHARD + 'idle_timeout = "soon"\n', "shards[0].streams[0].idle_timeout: "),
    ],
)
def test_websocket_values_are_checked_naming_the_key(text: str, problem: str) -> None:
    assert only_problem(text).startswith(problem)


def test_pings_off_need_no_timeout_and_a_stream_may_turn_them_off() -> None:
    parse("[websocket]\nping_interval = 0\nping_timeout = 0\n")
    parse("[websocket]\nping_timeout = 0\nping_interval = 0\n" + SHARD + "idle_timeout = 0\n")
    parse(SHARD + "ping_interval = 0\nping_timeout = 0\n")


def test_a_streams_unset_values_are_not_rendered_and_its_set_ones_read_back() -> None:
    config = parse(SHARD + 'idle_timeout = "5s"\nping_interval = 0\n')
    text = render_config(config)
    stream_part = text[text.index("[[shards.streams]]") :]
    assert 'idle_timeout = "5s"' in stream_part and 'ping_interval = "0s"' in stream_part
    assert "ping_timeout" not in stream_part and "compression" not in stream_part
    assert parse_config(tomllib.loads(text)) == config


def test_a_registered_shard_keeps_a_streams_timer_set_to_0() -> None:
    """`shards add` stores only what differs from the defaults: a timer turned off (0) is
    not a default (None: the section's), so it must survive the round trip."""
    stream = StreamSpec("a", "ws://h/x", idle_timeout=0.0, ping_interval=5.0, compression="none")
    shard = ShardConfig("n1", (stream,))
    assert decode_spec("n1", encode_spec(shard)) == shard
    assert "ping_timeout" not in encode_spec(shard)

"""The table's contract: keys, AttributeValues, expression names and the two writes a child's
last will shares with the supervisor's store (pure: parameters in, parameters out)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_worker.contract import table as t

CONTRACT = Path(t.__file__).parent


def test_keys_name_the_kind_and_the_id() -> None:
    assert t.shard_key("s-1") == {"pk": {"S": "shard#s-1"}}
    assert t.worker_key("host#7") == {"pk": {"S": "worker#host#7"}}


@pytest.mark.parametrize(
    ("value", "text"), [(0, "0"), (42, "42"), (1.5, "1.5"), (1700000000.25, "1700000000.25")]
)
def test_numbers_are_exact_decimals(value: float, text: str) -> None:
    assert t.number(value) == {"N": text}


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_survives_the_round_trip(value: float) -> None:
    assert float(t.number(value)["N"]) == value


def test_a_checkpoint_is_a_map_of_numbers() -> None:
    assert t.checkpoint_value({"a": 3, "b": 0}) == {"M": {"a": {"N": "3"}, "b": {"N": "0"}}}
    assert t.checkpoint_value({}) == {"M": {}}


def test_expression_names_come_from_the_expressions_and_must_be_attributes() -> None:
    names = t.expression_names("SET #owner = :me REMOVE #roster", "attribute_exists(pk)")
    assert names == {"#owner": "owner", "#roster": "roster"}
    with pytest.raises(ValueError, match="#ownr"):
        t.expression_names("SET #ownr = :me")


def test_the_release_is_fenced_on_owner_and_epoch_and_makes_the_shard_vacant() -> None:
    params = t.release_shard("s-1", "w1", 7, {"a": 12}, t.LAST_WILL).params("tbl")
    assert params == {
        "TableName": "tbl",
        "Key": {"pk": {"S": "shard#s-1"}},
        "UpdateExpression": (
            "SET #checkpoint = :cp, #state = :released, #roster = :vacant"
            " REMOVE #owner, #release_requested, #successor,"
            " #handoff_stage, #handoff_first, #handoff_at"
        ),
        "ConditionExpression": "#owner = :me AND #epoch = :epoch",
        "ExpressionAttributeNames": {
            "#checkpoint": "checkpoint",
            "#state": "state",
            "#roster": "roster",
            "#owner": "owner",
            "#release_requested": "release_requested",
            "#successor": "successor",
            "#handoff_stage": "handoff_stage",
            "#handoff_first": "handoff_first",
            "#handoff_at": "handoff_at",
            "#epoch": "epoch",
        },
        "ExpressionAttributeValues": {
            ":cp": {"M": {"a": {"N": "12"}}},
            ":released": {"S": "last-will"},
            ":vacant": {"S": "vacant"},
            ":me": {"S": "w1"},
            ":epoch": {"N": "7"},
        },
    }


def test_a_release_with_a_successor_names_it_instead_of_removing_it() -> None:
    plain = t.release_shard("s", "w1", 1, {})
    named = t.release_shard("s", "w1", 1, {}, successor="w2")
    assert plain.values[":released"] == {"S": "released"}
    assert plain.update.endswith(
        "REMOVE #owner, #release_requested, #successor, #handoff_stage, #handoff_first, #handoff_at"
    )
    assert ":successor" not in plain.values
    assert named.update == (
        "SET #checkpoint = :cp, #state = :released, #roster = :vacant, #successor = :successor"
        " REMOVE #owner, #release_requested, #handoff_stage, #handoff_first, #handoff_at"
    )
    assert named.values[":successor"] == {"S": "w2"}
    assert named.condition == plain.condition == t.OWNED_AT_EPOCH


def test_mark_orphaned_needs_the_session_and_leaves_a_clean_exit_alone() -> None:
    params = t.mark_orphaned("w1", "sess", 1700000000.5).params("tbl")
    assert params == {
        "TableName": "tbl",
        "Key": {"pk": {"S": "worker#w1"}},
        "UpdateExpression": "SET #state = :orphaned, #orphaned_at = :now",
        "ConditionExpression": "#session = :session AND #state <> :stopped",
        "ExpressionAttributeNames": {
            "#state": "state",
            "#orphaned_at": "orphaned_at",
            "#session": "session",
        },
        "ExpressionAttributeValues": {
            ":orphaned": {"S": "orphaned"},
            ":now": {"N": "1700000000.5"},
            ":session": {"S": "sess"},
            ":stopped": {"S": "stopped"},
        },
    }


def test_return_values_only_when_asked() -> None:
    update = t.UpdateItem(t.worker_key("w"), "ADD #mailbox :one", "attribute_exists(pk)", {})
    assert "ReturnValues" not in update.params("tbl")
    with_returns = t.UpdateItem(update.key, update.update, update.condition, {}, "ALL_NEW")
    assert with_returns.params("tbl")["ReturnValues"] == "ALL_NEW"


def test_the_contract_needs_only_attrs_and_the_standard_library() -> None:
    """Both processes import it: never the supervisor, trio-websocket, boto3 (or trio)."""
    for path in CONTRACT.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {
            alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names
        }
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        roots = {name.split(".")[0] for name in imported}
        allowed = {"attrs", "__future__", "shard_worker"} | sys.stdlib_module_names
        assert roots <= allowed, f"{path.name} imports {sorted(roots - allowed)}"
        inside = {name for name in imported if name.startswith("shard_worker")}
        assert all(name.startswith("shard_worker.contract") for name in inside), path.name

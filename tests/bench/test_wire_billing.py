"""The wire benchmark's bill (``benchmarks.wire_billing``): DynamoDB's unit rules on request and
response bodies, with plain numbers; and the computed bill against dynalite's own."""

from __future__ import annotations

import boto3
import pytest
from benchmarks.wire_billing import WireBill, item_size, update_targets, value_size

TABLE = "bench-billing"


def item(pk: str, payload: int) -> dict:
    """An item of ``payload`` + len(pk) + 3 bytes: ``pk`` and a string ``v``."""
    return {"pk": {"S": pk}, "v": {"S": "x" * payload}}


def key(pk: str) -> dict:
    return {"pk": {"S": pk}}


def test_sizes_count_names_and_values() -> None:
    assert item_size({"pk": {"S": "abc"}, "n": {"N": "12345"}}) == 2 + 3 + 1 + 4
    assert value_size({"N": "-100"}) == 2  # one significant digit, trimmed
    assert value_size({"B": "AAEC"}) == 3  # base64 of three bytes
    assert value_size({"BOOL": True}) == 1
    assert value_size({"M": {"a": {"S": "xy"}}}) == 3 + 1 + 2 + 1
    assert value_size({"L": [{"S": "xy"}, {"NULL": True}]}) == 3 + 3 + 2
    assert item_size(item("a", 5000)) == 5004


def test_get_item_bills_4_kb_units_halved_when_eventually_consistent() -> None:
    bill = WireBill()
    big = {"Item": item("a", 5000)}
    bill.bill(
        "GetItem", "GetItem", {"TableName": TABLE, "Key": key("a"), "ConsistentRead": True}, big
    )
    bill.bill("GetItem", "GetItem", {"TableName": TABLE, "Key": key("a")}, big)
    bill.bill("GetItem", "GetItem", {"TableName": TABLE, "Key": key("zz")}, {})  # missing: 0.5
    assert bill.read_units["GetItem"] == 2 + 1 + 0.5
    assert bill.computed == 3


def test_batch_get_bills_per_key_asked_less_the_unprocessed() -> None:
    bill = WireBill()
    asked = {"Keys": [key("a"), key("b"), key("c")], "ConsistentRead": True}
    answer = {
        "Responses": {TABLE: [item("a", 5000)]},  # b is missing, c came back unprocessed
        "UnprocessedKeys": {TABLE: {"Keys": [key("c")], "ConsistentRead": True}},
    }
    bill.bill("BatchGetItem", "BatchGetItem", {"RequestItems": {TABLE: asked}}, answer)
    assert bill.read_units["BatchGetItem"] == 2 + 1


def test_query_and_scan_bill_the_summed_size_and_what_a_filter_dropped() -> None:
    bill = WireBill()
    index = {"TableName": TABLE, "IndexName": "roster", "ConsistentRead": False}
    three = {"Items": [item(f"k{i}", 1995) for i in range(3)], "Count": 3}  # 6,000 B
    bill.bill("Query", "Query", index, three)
    assert bill.read_units["Query"] == 1.0  # 2 units of 4 KB, eventually consistent
    bill.bill("Query", "Query", index, {"Items": [], "Count": 0})
    assert bill.read_units["Query"] == 1.5  # an empty answer still costs the minimum
    filtered = {"Items": [item("k0", 1995)], "Count": 1, "ScannedCount": 5}  # 10,000 B read
    bill.bill("Scan", "Scan", {"TableName": TABLE, "ConsistentRead": True}, filtered)
    assert bill.read_units["Scan"] == 3.0


def test_writes_bill_1_kb_units_of_the_larger_item_seen_on_the_wire() -> None:
    bill = WireBill()
    put = {"TableName": TABLE, "Item": item("a", 5000)}
    bill.bill("PutItem", "PutItem", put, {})
    assert bill.write_units["PutItem"] == 5
    update = {"TableName": TABLE, "Key": key("a"), "UpdateExpression": "SET n = :one"}
    bill.bill("UpdateItem", "heartbeat", update, {})  # the put showed the size
    failed = {"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}
    bill.bill("UpdateItem", "take", update, failed)  # a failed condition is billed too
    assert bill.write_units["heartbeat"] == 5
    assert bill.write_units["take"] == 5
    returned = {"Attributes": item("b", 1500)}
    bill.bill(
        "UpdateItem", "take", {**update, "Key": key("b"), "ReturnValues": "ALL_NEW"}, returned
    )
    assert bill.write_units["take"] == 5 + 2


def test_an_update_of_an_unseen_item_is_corrected_when_a_read_shows_it() -> None:
    bill = WireBill()
    update = {"TableName": TABLE, "Key": key("a"), "UpdateExpression": "SET #checkpoint = :cp"}
    bill.bill("UpdateItem", "checkpoint", update, {})
    bill.bill("UpdateItem", "checkpoint", update, {})
    assert bill.write_units["checkpoint"] == 2  # one unit each until the size is known
    answer = {"Items": [item("a", 2500)], "Count": 1}
    bill.bill("Scan", "Scan", {"TableName": TABLE, "ConsistentRead": True}, answer)
    assert bill.late_units == 2 * 2  # 3 KB each: two more units per update
    assert bill.write_units["late"] == 4


def test_a_reported_consumed_capacity_wins_and_unknown_operations_are_counted() -> None:
    bill = WireBill()
    request = {"TableName": TABLE, "Key": key("a"), "ReturnConsumedCapacity": "TOTAL"}
    answer = {"Item": item("a", 10), "ConsumedCapacity": {"CapacityUnits": 7.0}}
    bill.bill("GetItem", "GetItem", request, answer)
    bill.bill("DescribeTable", "DescribeTable", {"TableName": TABLE}, {})
    bill.bill("TransactWriteItems", "TransactWriteItems", {}, {})
    assert bill.read_units["GetItem"] == 7.0
    assert (bill.from_server, bill.computed) == (1, 0)
    assert (dict(bill.free), dict(bill.unbilled)) == (
        {"DescribeTable": 1},
        {"TransactWriteItems": 1},
    )


@pytest.mark.slow
def test_the_computed_bill_agrees_with_dynalite_s_own(dynalite_server) -> None:
    """The same requests, once billed from the bodies and once asking dynalite (which bills as
    DynamoDB does when asked, ``ReturnConsumedCapacity``): the same units, op by op. On a table
    without an index: dynalite leaves index writes out of its bill."""
    client = boto3.client("dynamodb", endpoint_url=dynalite_server.url, region_name="us-east-1")
    table = "bench-billing-agree"
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=table)
    requests = [
        ("PutItem", {"TableName": table, "Item": item("a", 5000)}),
        ("PutItem", {"TableName": table, "Item": item("b", 300)}),
        (
            "UpdateItem",
            {
                "TableName": table,
                "Key": key("a"),
                "UpdateExpression": "SET n = :one",
                "ExpressionAttributeValues": {":one": {"N": "1"}},
            },
        ),
        ("GetItem", {"TableName": table, "Key": key("a"), "ConsistentRead": True}),
        ("GetItem", {"TableName": table, "Key": key("a")}),
        ("GetItem", {"TableName": table, "Key": key("missing"), "ConsistentRead": True}),
        (
            "BatchGetItem",
            {
                "RequestItems": {
                    table: {"Keys": [key("a"), key("b"), key("zz")], "ConsistentRead": True}
                }
            },
        ),
    ]
    computed, reported = WireBill(), WireBill()
    for op, params in requests:
        method = getattr(client, "".join("_" + c.lower() if c.isupper() else c for c in op)[1:])
        answer = method(**params)
        answer.pop("ResponseMetadata", None)
        computed.bill(op, op, params, answer)
        asked = {**params, "ReturnConsumedCapacity": "TOTAL"}
        answer = method(**asked)
        reported.bill(op, op, asked, answer)
    assert reported.from_server == len(requests)
    assert computed.computed == len(requests)
    assert dict(computed.read_units) == dict(reported.read_units)
    assert dict(computed.write_units) == dict(reported.write_units)


ROSTER = {  # DescribeTable's answer for a table like the lease table: a sparse INCLUDE index
    "Table": {
        "TableName": TABLE,
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": "roster",
                "KeySchema": [{"AttributeName": "roster", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["epoch"]},
            }
        ],
    }
}


def update(expression: str, **names: str) -> dict:
    return {
        "TableName": TABLE,
        "Key": key("s1"),
        "UpdateExpression": expression,
        "ExpressionAttributeNames": {f"#{n}": v for n, v in names.items()},
    }


def test_update_targets_reads_every_clause() -> None:
    expression = (
        "SET #a = if_not_exists(#a, :z) + :one, #b = list_append(#b, :l) "
        "REMOVE #c, #d.e ADD #n :one"
    )
    names = {"#a": "a", "#b": "b", "#c": "c", "#d": "d", "#n": "n"}
    assert update_targets(expression, names) == ({"a", "b", "d", "n"}, {"c"})


def test_index_writes_when_an_item_enters_leaves_or_changes_a_projected_attribute() -> None:
    bill = WireBill()
    bill.bill("DescribeTable", "DescribeTable", {"TableName": TABLE}, ROSTER)
    vacant = {"pk": {"S": "s1"}, "roster": {"S": "vacant"}, "epoch": {"N": "1"}}
    bill.bill("PutItem", "PutItem", {"TableName": TABLE, "Item": vacant}, {})
    assert bill.write_units["PutItem"] == 1 + 1  # the item and its index entry
    bill.bill("UpdateItem", "heartbeat", update("SET #c = #c + :one", c="counter"), {})
    assert bill.write_units["heartbeat"] == 1  # counter is not projected
    bill.bill("UpdateItem", "other", update("SET #e = :e", e="epoch"), {})
    assert bill.write_units["other"] == 1 + 1  # a projected attribute of an indexed item
    take = update("SET #o = :me, #e = :next REMOVE #r", o="owner", e="epoch", r="roster")
    failed = {"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}
    bill.bill("UpdateItem", "take", take, failed)
    assert bill.write_units["take"] == 1  # a failed condition writes no index
    bill.bill("UpdateItem", "take", take, {})
    assert bill.write_units["take"] == 1 + 1 + 1  # leaves the index
    bill.bill("UpdateItem", "checkpoint", update("SET #e = :e", e="epoch"), {})
    assert bill.write_units["checkpoint"] == 1  # out of the index now
    release = update("SET #r = :vacant REMOVE #o", r="roster", o="owner")
    bill.bill("UpdateItem", "release", release, {})
    assert bill.write_units["release"] == 1 + 1  # back in
    assert bill.index_units == 4

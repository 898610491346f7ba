"""The CloudWatch Embedded Metric Format specification's rules, as a checker for tests.

From https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/
CloudWatch_Embedded_Metric_Format_Specification.html: a root ``_aws`` object with an integer
``Timestamp`` (ms since the epoch) and a ``CloudWatchMetrics`` array of directives; each
directive names a ``Namespace`` (1-255 characters), ``Dimensions`` (an array of dimension
sets, each an array of at most 30 names, every name a string member at the top level) and
``Metrics`` (at most 100 per document, each with a ``Name`` of 1-255 characters and an
optional ``Unit`` from CloudWatch's list) whose values are numbers at the top level.
"""

from __future__ import annotations

from typing import Any

UNITS = {
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes",
    "Terabytes", "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count",
    "Bytes/Second", "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second",
    "Terabytes/Second", "Bits/Second", "Kilobits/Second", "Megabits/Second", "Gigabits/Second",
    "Terabits/Second", "Count/Second", "None",
}  # fmt: skip


def check_emf(doc: Any) -> list[str]:
    """What breaks the specification in ``doc`` (one parsed line); [] when nothing does."""
    if not isinstance(doc, dict) or not isinstance(doc.get("_aws"), dict):
        return ["no _aws object at the root"]
    meta = doc["_aws"]
    problems = []
    if not isinstance(meta.get("Timestamp"), int) or isinstance(meta.get("Timestamp"), bool):
        problems.append("_aws.Timestamp is not an integer")
    directives = meta.get("CloudWatchMetrics")
    if not isinstance(directives, list) or not directives:
        return [*problems, "_aws.CloudWatchMetrics is not a non-empty array"]
    metrics = 0
    for directive in directives:
        problems += _check_directive(doc, directive)
        metrics += len(directive.get("Metrics", []))
    if metrics > 100:
        problems.append(f"{metrics} metrics in one document (at most 100)")
    return problems


def _check_directive(doc: dict[str, Any], directive: dict[str, Any]) -> list[str]:
    problems = []
    namespace = directive.get("Namespace")
    if not isinstance(namespace, str) or not 1 <= len(namespace) <= 255:
        problems.append(f"bad Namespace {namespace!r}")
    sets = directive.get("Dimensions")
    if not isinstance(sets, list):
        return [*problems, "Dimensions is not an array"]
    for dims in sets:
        if not isinstance(dims, list) or len(dims) > 30:
            problems.append(f"a dimension set is not an array of at most 30 names: {dims!r}")
            continue
        for name in dims:
            if not isinstance(doc.get(name), str):
                problems.append(f"dimension {name!r} is not a string member at the top level")
    for metric in directive.get("Metrics", []):
        name = metric.get("Name")
        if not isinstance(name, str) or not 1 <= len(name) <= 255:
            problems.append(f"bad metric name {name!r}")
            continue
        value = doc.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"metric {name!r} is not a number at the top level: {value!r}")
        if "Unit" in metric and metric["Unit"] not in UNITS:
            problems.append(f"metric {name!r}: unknown unit {metric['Unit']!r}")
    return problems

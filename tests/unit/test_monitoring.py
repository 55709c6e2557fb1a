"""The Grafana dashboard and the Prometheus alert rules in deploy/monitoring/ against the
code: they use only metric names the exporter and a driver's worker and query metrics emit,
every alert has a firing and a non-firing case in the rules' test file, and docs/operations.md
lists every metric. ``promtool check rules`` and ``promtool test rules`` run with the promtool
``make promtool`` caches (or ``$PROMTOOL``, or one on ``PATH``); skipped only without one."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from pyspark_kafka_share.exporter.query import QUERY_METRIC_NAMES
from pyspark_kafka_share.exporter.serve import METRIC_NAMES
from pyspark_kafka_share.exporter.workers import WORKER_METRIC_NAMES
from pyspark_kafka_share.harness.jars import cache_dir

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "kafka-share-alerts.yml"
RULES_TEST = MONITORING / "kafka-share-alerts.test.yml"
DASHBOARD = MONITORING / "kafka-share-dashboard.json"
NAME = re.compile(r"\bkafka_share_[a-z0-9_]+\b")
EMITTED = set(METRIC_NAMES) | set(QUERY_METRIC_NAMES) | set(WORKER_METRIC_NAMES)
ON_THE_DASHBOARD = set(METRIC_NAMES) | {
    # the workers' and the queries' metrics a dashboard needs (every one: the docs' tables)
    *(f"kafka_share_workers_{n}_total" for n in (
        "processed", "accepted", "released", "rejected", "dead_lettered", "exhausted",
        "failures", "produce_failures", "ack_failures", "released_lock_deadline",
        "transactions", "transactions_aborted", "marker_conflicts")),
    *(f"kafka_share_workers_{n}" for n in (
        "in_flight", "idle_seconds", "running", "job_active", "job_failed", "attempt")),
    "kafka_share_query_lag", "kafka_share_query_active", "kafka_share_query_input_rows_total",
    *(f"kafka_share_query_batch_{n}_total" for n in (
        "records", "accepted", "records_lost", "commit_failures", "duplicates_dropped")),
}
PROMTOOL_VERSION = re.findall(r"^PROMTOOL_VERSION \?= (\S+)$",
                              (ROOT / "Makefile").read_text(), re.M)[0]


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


def _balanced(expr: str) -> bool:
    depth = 0
    for ch in expr:
        depth += {"(": 1, ")": -1, "[": 1, "]": -1, "{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def test_the_rules_use_only_metrics_the_code_emits() -> None:
    rules = _rules()
    assert {r["alert"] for r in rules} == {
        "KafkaShareLagGrowing", "KafkaShareDeadLetters", "KafkaShareGroupWithoutMembers",
        "KafkaShareGroupStalled", "KafkaShareExporterDown", "KafkaShareWorkersFailed",
        "KafkaShareWorkersGivingUp", "KafkaShareWorkersStalled"}
    for rule in rules:
        used = set(NAME.findall(rule["expr"]))
        assert used and used <= EMITTED, (rule["alert"], used - EMITTED)
        assert _balanced(rule["expr"]), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", "0s"))), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_the_dashboard_uses_only_metrics_the_code_emits() -> None:
    exprs = _dashboard_exprs()
    assert len(exprs) >= 10
    used = {n for e in exprs for n in NAME.findall(e)}
    assert used <= EMITTED, used - EMITTED
    assert ON_THE_DASHBOARD <= EMITTED, ON_THE_DASHBOARD - EMITTED
    missing = ON_THE_DASHBOARD - used
    assert not missing, f"metrics the dashboard does not show: {missing}"
    assert all(_balanced(e) for e in exprs)


def test_every_alert_has_a_firing_and_a_non_firing_case() -> None:
    cases: dict[str, set[bool]] = {}
    tests = yaml.safe_load(RULES_TEST.read_text())
    assert tests["rule_files"] == [RULES.name]
    for test in tests["tests"]:
        names = {s["series"].split("{")[0] for s in test["input_series"]}
        assert names <= EMITTED, names - EMITTED
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], set()).add(bool(case["exp_alerts"]))
    assert cases == {r["alert"]: {True, False} for r in _rules()}


def test_operations_lists_every_metric() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    listed = set(re.findall(r"^\| `(kafka_share_[a-z0-9_]+)` \|", text, re.M))
    assert listed == EMITTED


def _promtool() -> str:
    """``$PROMTOOL``, else the one ``make promtool`` built into the cache, else ``PATH``'s."""
    cached = cache_dir() / f"promtool-{PROMTOOL_VERSION}" / "promtool"
    found = os.environ.get("PROMTOOL") or (str(cached) if cached.is_file() else None) \
        or shutil.which("promtool")
    if not found:
        pytest.skip(f"no promtool: `make promtool` builds it from the Go module proxy into "
                    f"{cached.parent} (or set $PROMTOOL)")
    return found


@pytest.mark.parametrize("command", [["check", "rules", RULES.name],
                                     ["test", "rules", RULES_TEST.name]])
def test_promtool(command: list[str]) -> None:
    done = subprocess.run([_promtool(), *command], cwd=MONITORING, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

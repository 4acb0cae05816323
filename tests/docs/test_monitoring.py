"""The alert rules and the Grafana dashboard that ship with the docs name real metrics.

``promtool`` (Debian's ``prometheus`` package) checks the rule file and runs its unit
tests, which fire each alert on made-up series; and every metric a rule or a panel
queries must be one the producer or the checker exports, so a renamed metric fails
here instead of leaving an alert that can never fire.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import outbox.metrics  # noqa: F401  (registers the producer's metrics)
import outbox_checker.metrics  # noqa: F401  (registers the checker's metrics)

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
RULES = MONITORING / "outbox-alerts.yml"
RULE_TESTS = MONITORING / "outbox-alerts.test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
METRIC = re.compile(r"\boutbox_[a-z_]+")


def exported_samples() -> set[str]:
    """Every sample name the outbox's metrics expose (``_total``, ``_bucket``, ...)."""
    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.startswith("outbox_"):
            names.add(family.name)
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
            names |= {family.name + suffix for suffix in suffixes.get(family.type, ())}
    return names


def queried_metrics() -> dict[str, set[str]]:
    rules = yaml.safe_load(RULES.read_text())
    queries = {
        f"alert {rule['alert']}": rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
    }
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            queries[f"panel {panel['title']!r}"] = (
                queries.get(f"panel {panel['title']!r}", "") + " " + target["expr"]
            )
    return {where: set(METRIC.findall(expr)) for where, expr in queries.items()}


@pytest.mark.parametrize(
    "args", [("check", "rules", RULES.name), ("test", "rules", RULE_TESTS.name)]
)
def test_promtool_accepts_the_rules_and_their_unit_tests(args: tuple[str, ...]) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (.ci/run does)"
    result = subprocess.run(
        [promtool, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_queried_metric_is_exported() -> None:
    exported = exported_samples()
    unknown = {
        where: sorted(names - exported)
        for where, names in queried_metrics().items()
        if names - exported
    }
    assert not unknown, f"queries of metrics nobody exports: {unknown}"
    assert len(queried_metrics()) >= 15


def test_the_check_catches_a_renamed_metric() -> None:
    assert "outbox_checker_relay_lag" in exported_samples()
    assert "outbox_checker_relay_lagging" not in exported_samples()

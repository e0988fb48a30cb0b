"""The monitoring files in deploy/monitoring: the alert rules (promtool checks them and runs their unit tests,
every alert has a case that fires it and one that does not), the Grafana dashboards (valid, importable, every
query valid PromQL), and every metric name and label they use is one that /metrics really exposes.

promtool is Debian's (the ``prometheus`` package; ``.ci/services`` installs it); without it the tests that run
it skip, saying so. The exposed names come from the real collector over a small database state (the pool, three
tenants, a running job, a queued one, an interrupted attempt, budgets, a worker's task counts), so a family that
is renamed, or a label that is, breaks a test here before it breaks an operator's dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
ALERTS = MONITORING / "alerts.yaml"
ALERT_TESTS = MONITORING / "alerts_test.yaml"
DASHBOARDS = sorted((MONITORING / "dashboards").glob("*.json"))
DOCS = ROOT / "docs" / "monitoring.md"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed: apt-get install prometheus (.ci/services installs it)"
)

SEVERITIES = {"critical", "warning", "info"}
# Grafana's interval variables and the dashboards' own ($window): they stand where PromQL wants a duration.
DURATION_VARIABLES = ("__rate_interval", "__interval", "__range", "window")
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"}


def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in DASHBOARDS}


def all_panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside it


def dashboard_queries() -> Iterator[tuple[str, str, str]]:
    """(where, expression, kind) for every query of every dashboard: kind ``expr`` (a panel's target, PromQL
    with Grafana's variables) or ``variable`` (a template variable's query)."""
    for name, board in dashboards().items():
        for panel in all_panels(board):
            for target in panel.get("targets", []):
                yield f"{name} panel {panel['id']} ({panel.get('title')}) {target.get('refId')}", target["expr"], "expr"
        for variable in board["templating"]["list"]:
            if variable.get("type") == "query":
                query = variable["query"]
                query = query["query"] if isinstance(query, dict) else query
                yield f"{name} variable {variable['name']}", query, "variable"


# --- PromQL, read closely enough to name what a query uses ----------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' r"|'(?:[^'\\]|\\.)*'" r"|`[^`]*`")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_SELECTOR = re.compile(r"(?<![\w:$.])([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
_WORD = re.compile(r"(?<![\w:$.])[A-Za-z_:][\w:]*")
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end",
}  # fmt: skip


def substitute_variables(expr: str) -> str:
    """Grafana's variables replaced so that PromQL parses: durations by ``5m``, the rest (label values, inside
    strings) by ``placeholder``. A variable outside a string then reads as a metric named placeholder."""
    durations = "|".join(DURATION_VARIABLES)
    text = re.sub(rf"\$\{{({durations})\}}|\$({durations})\b", "5m", expr)
    return re.sub(r"\$\{[^}]*\}|\$\w+", "placeholder", text)


def _mask_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: not functions, aggregations, keywords, labels (in braces and
    in by/on/... lists), strings, numbers or durations."""
    text = _mask_strings(expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges and subqueries
    text = _GROUPING.sub(" ", text)  # label lists, and the words before them: "sum by (x) (" is a call of sum
    names = set()
    for match in _WORD.finditer(text):
        word = match.group()
        if word.lower() in _KEYWORDS or re.match(r"\s*\(", text[match.end() :]):
            continue  # a keyword, a function or an aggregation
        names.add(word)
    return names


def selector_labels(expr: str) -> list[tuple[str, str]]:
    """(metric, label) for each label matcher of a selector that names its metric."""
    found = []
    for match in _SELECTOR.finditer(_mask_strings(expr)):
        metric, matchers = match.group(1), match.group(2)
        if metric and metric.lower() not in _KEYWORDS:
            found += [(metric, label) for label in re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers)]
    return found


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for match in _GROUPING.finditer(_mask_strings(expr)):
        labels |= {label.strip() for label in match.group(2).split(",") if label.strip()}
    return labels


def test_promql_reading_names_metrics_only():
    expr = (
        'sum by (tenant, le) (rate(polychip_admission_wait_seconds_bucket{tenant=~"$tenant",le!="+Inf"}[5m] '
        "offset 1h)) / on(tenant) group_left(name) max without (by) (polychip_job_info) > bool 1e3 "
        'and time() - polychip_admission_last_cycle_timestamp_seconds > 0x1F or vector(Inf) unless up{job="a b"}'
    )
    assert metric_names(expr) == {
        "polychip_admission_wait_seconds_bucket",
        "polychip_job_info",
        "polychip_admission_last_cycle_timestamp_seconds",
        "up",
    }
    assert selector_labels(expr) == [
        ("polychip_admission_wait_seconds_bucket", "tenant"),
        ("polychip_admission_wait_seconds_bucket", "le"),
        ("up", "job"),
    ]
    assert grouping_labels(expr) == {"tenant", "le", "name", "by"}
    assert substitute_variables('rate(x{a=~"$tenant",b="${flavor:regex}"}[$__rate_interval]) [${window}]') == (
        'rate(x{a=~"placeholder",b="placeholder"}[5m]) [5m]'
    )


# --- (a)-(c) the alert rules ------------------------------------------------------------------------------


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    result = promtool("check", "rules", ALERTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_alert_rules_pass_their_unit_tests():
    result = promtool("test", "rules", ALERT_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not():
    cases = [case for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)), "alert names repeat"
    fired = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert set(names) - fired == set(), "alerts without a case that fires them"
    assert set(names) - quiet == set(), "alerts without a case where they stay quiet"
    assert (fired | quiet) - set(names) == set(), "cases of alerts that do not exist"
    for case in cases:
        for alert in case.get("exp_alerts") or []:
            # A firing case pins the alert's rendered text, the templating included.
            assert {"summary", "description", "runbook"} <= set(alert.get("exp_annotations") or {}), case


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.MULTILINE):
        anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", heading.strip().lower())))
    return anchors


def test_every_alert_says_how_bad_what_and_where_its_runbook_is():
    anchors = _anchors(DOCS.read_text())
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        notes = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(notes), name
        for key in ("summary", "description"):
            assert "{{ $labels" in notes[key] or "{{ $value" in notes[key], f"{name}: {key} shows no label or value"
        page, _, anchor = notes["runbook"].partition("#")
        assert page == "docs/monitoring.md", name
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section {notes['runbook']}"


# --- (d) the dashboards -------------------------------------------------------------------------------------


def test_the_four_dashboards_are_there():
    assert {path.name for path in DASHBOARDS} == {
        "polychip-cluster.json",
        "polychip-queues.json",
        "polychip-jobs.json",
        "polychip-billing.json",
    }


def test_dashboards_are_importable_grafana_json():
    uids = []
    for name, board in dashboards().items():
        assert board.get("title") and isinstance(board.get("schemaVersion"), int), name
        assert board["schemaVersion"] >= 36, name
        uids.append(board["uid"])
        assert re.fullmatch(r"[\w-]{1,40}", board["uid"]), name

        variables = {variable["name"]: variable for variable in board["templating"]["list"]}
        source = variables.get("datasource")
        assert source is not None and source["type"] == "datasource" and source["query"] == "prometheus", name
        for variable in variables.values():
            if variable["type"] == "query":
                assert variable["datasource"]["uid"] == "${datasource}", (name, variable["name"])

        panels = list(all_panels(board))
        assert panels, name
        ids = [panel["id"] for panel in panels]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        cells: dict[tuple[int, int], int] = {}
        for panel in panels:
            where = f"{name} panel {panel['id']} ({panel.get('title')})"
            pos = panel["gridPos"]
            assert all(isinstance(pos[key], int) for key in ("h", "w", "x", "y")), where
            assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, where
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, f"{where} overlaps panel {cells.get((x, y))}"
                    cells[(x, y)] = panel["id"]
            if panel["type"] == "row":
                continue
            assert panel.get("title"), where
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
            targets = panel.get("targets") or []
            assert targets, f"{where} has no query"
            refs = [target.get("refId") for target in targets]
            assert all(refs) and len(refs) == len(set(refs)), where
            for target in targets:
                assert target.get("expr", "").strip(), f"{where} {target.get('refId')} has no expr"
                assert target.get("datasource", panel["datasource"])["uid"] == "${datasource}", where
                used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
                assert used - GRAFANA_BUILTINS - set(variables) == set(), f"{where}: undefined variables"
    assert len(uids) == len(set(uids)), "dashboard uids repeat"


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path):
    rules, where_of = [], {}
    for index, (where, expr, kind) in enumerate(dashboard_queries()):
        if kind != "expr":
            continue
        record = f"dashboard:query_{index}"
        where_of[record] = where
        rules.append({"record": record, "expr": substitute_variables(expr)})
    assert len(rules) > 40
    path = tmp_path / "dashboard_queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}, width=1000))
    result = promtool("check", "rules", str(path), cwd=tmp_path)
    output = result.stdout + result.stderr
    for record, where in where_of.items():
        output = output.replace(f'"{record}"', f'"{record}" ({where})')
    assert result.returncode == 0, output


def test_template_variables_are_label_values_queries():
    for where, query, kind in dashboard_queries():
        if kind == "variable":
            assert re.fullmatch(r"label_values\(\s*[A-Za-z_:][\w:]*\s*,\s*\w+\s*\)", query), where


# --- (e) every name the files use is exposed ----------------------------------------------------------------


def _exposition_state(tenants: Any) -> None:
    """A little of everything /metrics reads: a running job with telemetry, a queued one that was interrupted
    twice, a finished one, admission waits and cycles, device readings, a borrowing limit, a worker's task
    counts, budgets."""
    from django.utils import timezone

    from billing import services as billing
    from controlplane.models import TaskCounter, WorkerBeat
    from controlplane.taskstats import RUNTIME_BUCKETS
    from jobs import services as jobs
    from jobs.admission import WAIT_BUCKETS
    from jobs.models import AdmissionLock, AdmissionWait, Device, JobAttempt, JobState, TrainingJob
    from runtime.jobspec import parse_job_spec
    from tenants.models import NAU_RESOURCE, Quota
    from tests.attempts import device_ids, running_on

    acme, globex, _ = tenants
    now = timezone.now()
    running = running_on(acme.id, device_ids("a100-sxm", 2))
    TrainingJob.objects.filter(pk=running.pk).update(
        samples_per_s=512.0,
        last_loss=2.5,
        steps_done=10,
        balance_stats={"efficiency": 0.93},
        comm_stats={"last_step": {"collective_s": 0.02, "comm_bytes_cross": 4096}},
    )
    JobAttempt.objects.filter(job_id=running.pk).update(first_step_at=now - timedelta(minutes=1))

    spec = parse_job_spec({"name": "waiting", "devices": 2, "flavors": ["a100-sxm"], "workload": {"steps": 10}})
    queued = jobs.submit_job(tenant_id=globex.id, user_id=None, spec=spec)
    TrainingJob.objects.filter(pk=queued.id).update(pending_reason="waiting for devices: 2 a100-sxm are busy")
    for number, (ended_as, reason) in enumerate(
        [(JobState.RECOVERING, "rank 1 exited with code 1"), (JobState.QUEUED, "preempted by job 1")], start=1
    ):
        JobAttempt.objects.create(job_id=queued.id, number=number, ended_at=now, ended_as=ended_as, end_reason=reason)

    done = jobs.submit_job(tenant_id=acme.id, user_id=None, spec=spec)
    TrainingJob.objects.filter(pk=done.id).update(state=JobState.SUCCEEDED)
    Quota.objects.filter(tenant_id=globex.id, resource=NAU_RESOURCE).update(borrowing_limit=Decimal("10"))

    AdmissionWait.objects.create(
        tenant_id=acme.id, band="normal", count=1, sum_s=3.0, buckets=[0, *[1] * len(WAIT_BUCKETS)]
    )
    AdmissionLock.objects.update_or_create(pk=1, defaults={"last_cycle_at": now, "last_cycle_s": 0.05})
    first = device_ids("a100-sxm", 1)[0]
    Device.objects.filter(device_id=first).update(last_reading=[61.0, 310.0, 0.0, 0.0, 0.02], failure_score=0.1)
    TaskCounter.objects.create(
        task="jobs.tasks.admit_queued_jobs",
        succeeded=5,
        failed=1,
        runtime_sum_s=0.2,
        runtime_buckets=[6] * (len(RUNTIME_BUCKETS) + 1),
    )
    WorkerBeat.objects.create(hostname="celery@test", seen_at=now)
    billing.set_budgets(acme.id, soft=Decimal("100"), hard=Decimal("200"))
    billing.check_budgets_now()  # beat's budget check: the spend /metrics reads


def _exposed(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """The names a scrape of ``text`` gives Prometheus (an empty family's too, from its TYPE line), and each
    name's labels (from its samples)."""
    from prometheus_client.parser import text_string_to_metric_families

    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE):
        if kind == "counter":
            names.add(name if name.endswith("_total") else f"{name}_total")
        elif kind in ("histogram", "summary"):
            names |= {f"{name}_sum", f"{name}_count"} | ({f"{name}_bucket"} if kind == "histogram" else {name})
        else:
            names.add(name)
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.add(sample.name)
            labels.setdefault(sample.name, set()).update(sample.labels)
    return names, labels


@pytest.mark.django_db
def test_every_metric_and_label_the_files_use_is_exposed(pool, tenants):
    from controlplane import metrics

    _exposition_state(tenants)
    names, labels = _exposed(metrics.scrape().decode())  # what /metrics serves, its own renderer included
    # Prometheus's own series of every target (the scrape's health), which the files may use too.
    names.add("up")
    labels["up"] = {"job", "instance"}
    assert {"polychip_celery_tasks_total", "polychip_admission_wait_seconds_bucket", "DCGM_FI_DEV_GPU_TEMP"} <= names

    queries = [(f"alerts.yaml {rule['alert']}", rule["expr"]) for rule in alert_rules()]
    for where, query, kind in dashboard_queries():
        if kind == "expr":
            queries.append((where, substitute_variables(query)))
        else:  # label_values(metric, label)
            metric, label = re.findall(r"[\w:]+", query)[1:3]
            assert metric in names, f"{where}: {metric} is not exposed"
            assert label in labels.get(metric, set()), f"{where}: {metric} has no label {label}"

    problems = []
    for where, expr in queries:
        used = metric_names(expr)
        if not used:
            problems.append(f"{where}: no metric found in {expr!r}")
        for name in sorted(used - names):
            problems.append(f"{where}: {name} is not exposed by /metrics")
        known = set().union(*(labels.get(name, set()) for name in used))
        for name in used & names:
            if name not in labels:
                problems.append(f"{where}: {name} has no sample in the test's state; give it one")
        for metric, label in selector_labels(expr):
            if metric in labels and label not in labels[metric]:
                problems.append(f"{where}: {metric} has no label {label}")
        for label in sorted(grouping_labels(expr) - known):
            problems.append(f"{where}: no series of {sorted(used)} has a label {label}")
    assert not problems, "\n".join(problems)

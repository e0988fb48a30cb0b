"""Structured logs (``controlplane.logs``): one JSON object per line, the bound context in it, chatty
loggers kept quiet, and the request id carried through a request and answered."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import structlog

from controlplane import logs


def formatter(fmt: str = "json") -> logging.Formatter:
    spec = dict(logs.logging_config("INFO", fmt)["formatters"]["structured"])
    factory = spec.pop("()")
    made: logging.Formatter = factory(**spec)
    return made


def record(message: str, *args: object, level: int = logging.INFO, name: str = "jobs.lifecycle", **extra: object):
    made = logging.LogRecord(name, level, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    return made


@pytest.fixture(autouse=True)
def _fresh_context():
    structlog.contextvars.clear_contextvars()
    yield
    structlog.contextvars.clear_contextvars()


def test_a_line_is_one_json_object_with_time_level_logger_and_the_bound_context():
    with logs.bound(request_id="r-1", tenant=7, job=42, attempt=1):
        line = formatter().format(record("provisioning job %s failed", 42, level=logging.WARNING))

    parsed = json.loads(line)
    assert parsed["event"] == "provisioning job 42 failed"
    assert (parsed["level"], parsed["logger"]) == ("warning", "jobs.lifecycle")
    assert (parsed["request_id"], parsed["tenant"], parsed["job"], parsed["attempt"]) == ("r-1", 7, 42, 1)
    assert parsed["time"].endswith("Z")
    assert "\n" not in line


def test_an_exception_comes_whole_in_the_line_and_extra_fields_are_kept():
    try:
        raise ValueError("boom")
    except ValueError:
        made = record("sweep failed", level=logging.ERROR, device="node-1/0")
        made.exc_info = sys.exc_info()
    parsed = json.loads(formatter().format(made))
    assert "ValueError: boom" in parsed["exception"] and parsed["device"] == "node-1/0"


def test_the_text_format_is_one_plain_line():
    line = formatter("text").format(record("ready"))
    assert "ready" in line and not line.startswith("{")


def test_the_chatty_loggers_are_kept_at_warning_unless_one_asks_for_debug():
    config = logs.logging_config("INFO")
    assert config["root"]["level"] == "INFO"
    for name in ("celery.app.trace", "celery.worker.strategy", "django.db.backends", "uvicorn.access"):
        assert config["loggers"][name]["level"] == "WARNING", name
    assert logs.logging_config("DEBUG")["loggers"] == {}


def test_a_request_carries_its_id_through_and_answers_it(rf):
    from django.http import HttpResponse

    from controlplane.middleware import RequestContextMiddleware

    seen: list[dict] = []

    def view(request):
        logs.bind(tenant=3)  # as authentication does
        seen.append(structlog.contextvars.get_contextvars())
        return HttpResponse("ok")

    middleware = RequestContextMiddleware(view)
    response = middleware(rf.get("/", headers={"X-Request-ID": "abc-123"}))
    assert response["X-Request-ID"] == "abc-123" and seen[-1] == {"request_id": "abc-123", "tenant": 3}

    made_up = middleware(rf.get("/", headers={"X-Request-ID": "no spaces allowed\n"}))["X-Request-ID"]
    assert len(made_up) == 32 and made_up != "abc-123"
    assert seen[-1] == {"request_id": made_up, "tenant": 3}  # the earlier request's context is gone

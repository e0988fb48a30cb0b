"""Structured logs: every Polychip process (the ASGI server, the Celery worker and beat) writes JSON lines.

Each line is one object: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``event`` (the message), and
the context bound where the work is: ``request_id`` for an HTTP request (its ``X-Request-ID``, or one
made up and answered in that header), ``tenant`` once a request is authenticated, ``task`` and ``job``
in a Celery task that works on a job, ``attempt`` where a job's attempt is known. Exceptions come as
``exception`` (the formatted traceback).

Quiet by default: the level is ``POLYCHIP_LOG_LEVEL`` (INFO), but the lines that say only that things
went well (Celery's one per received and per succeeded task, the access log of every request, each SQL
statement) are kept at WARNING, unless the level is DEBUG. ``POLYCHIP_LOG_FORMAT=text`` gives plain
lines for a terminal.

Records from any library pass through the same formatter (structlog's ``ProcessorFormatter`` over the
standard library's logging), so nothing is written twice or in two formats.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

# Chatty loggers and the level they are kept at (each says only that something went well).
QUIET = {
    "django.db.backends": "WARNING",  # a line per SQL statement at DEBUG
    "celery.app.trace": "WARNING",  # "Task ... succeeded in 0.01s"
    "celery.worker.strategy": "WARNING",  # "Task ... received"
    "celery.beat": "WARNING",  # "Scheduler: Sending due task ..." every second
    "uvicorn.access": "WARNING",
    "kombu": "WARNING",
}

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.ExtraAdder(),
    structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
]


def logging_config(level: str = "INFO", fmt: str = "json") -> dict[str, Any]:
    """The ``LOGGING`` dict for Django (``logging.config.dictConfig``)."""
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {
                "()": structlog.stdlib.ProcessorFormatter,
                "foreign_pre_chain": _SHARED,
                "processors": [
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    renderer,
                ],
            }
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
        "root": {"handlers": ["console"], "level": level},
        # At DEBUG everything speaks (what one asks for when following each task).
        "loggers": {} if level == "DEBUG" else {name: {"level": quiet} for name, quiet in QUIET.items()},
    }


def configure_structlog() -> None:
    """structlog's own loggers (``structlog.get_logger``) go through the standard library's, as above, and
    so do Python's warnings (a library's warning is a log line like any other, not text on stderr)."""
    logging.captureWarnings(True)
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


bind = structlog.contextvars.bind_contextvars
unbind = structlog.contextvars.unbind_contextvars
clear = structlog.contextvars.clear_contextvars
bound = structlog.contextvars.bound_contextvars

"""structlog set-up: JSON lines by default, readable console output on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from proxy.decode.events import Event, SwitchEvent

SECRET_KEYS = frozenset({"authorization", "api_key", "x-api-key", "proxy-authorization"})


def drop_secrets(_logger: object, _method: str, event: dict) -> dict:
    """Never let a key or Authorization header reach a log line."""
    for key in list(event):
        if key.lower() in SECRET_KEYS:
            event[key] = "[redacted]"
    return event


def configure(*, json_lines: bool | None = None, level: int = logging.INFO) -> None:
    """Configure structlog once per process."""
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            drop_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


class SwitchLog:
    """A subscriber that logs a generation's switch from speculation to plain decoding."""

    def __init__(self, log: Any) -> None:  # a structlog logger
        self._log = log

    def __call__(self, event: Event) -> None:
        if isinstance(event, SwitchEvent):
            self._log.info("switch_to_plain", reason=event.reason)

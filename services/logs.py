"""structlog set-up shared by every hookbus process.

JSON lines when the output is not a terminal (services, CI), readable colour on a
terminal; lines carry `completion_id` wherever the code has one (bound explicitly or
through structlog's contextvars).
"""

from __future__ import annotations

import logging
import sys

import structlog

from hookbus.bus.settings import get_settings


def configure_logging(fmt: str | None = None, level: str | None = None) -> None:
    settings = get_settings()
    fmt = fmt or settings.log_format
    level_no = logging.getLevelNamesMapping().get((level or settings.log_level).upper(), logging.INFO)
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info if as_json else structlog.processors.StackInfoRenderer(),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )

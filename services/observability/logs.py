"""structlog set-up shared by every hookbus process.

JSON lines when the output is not a terminal (services, CI), readable colour on a
terminal; lines carry `completion_id` wherever the code has one (bound explicitly or
through structlog's contextvars), and `trace_id` / `span_id` of the current span while
tracing is on (hookbus.services.observability.tracing). In JSON mode the standard-library loggers (FastStream,
uvicorn, redis) write JSON lines too: a container's log is then one JSON object per line,
which is what log collectors parse.
"""

from __future__ import annotations

import logging
import sys

import structlog

from hookbus.bus.settings import get_settings
from hookbus.services.observability.tracing import add_trace_ids


def configure_logging(fmt: str | None = None, level: str | None = None) -> None:
    settings = get_settings()
    fmt = fmt or settings.log_format
    level_no = logging.getLevelNamesMapping().get((level or settings.log_level).upper(), logging.INFO)
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    if as_json:
        _stdlib_as_json(renderer, level_no)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info if as_json else structlog.processors.StackInfoRenderer(),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


# FastStream's own logger does not propagate and prints coloured text to stderr.
_NON_PROPAGATING = ("faststream",)


def _stdlib_as_json(renderer: structlog.typing.Processor, level_no: int) -> None:
    """One JSON handler on the root logger and in place of FastStream's coloured one."""
    formatter = structlog.stdlib.ProcessorFormatter(
        processor=renderer,
        foreign_pre_chain=[
            add_trace_ids,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    handler.set_name("hookbus-json")
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if h.get_name() != "hookbus-json"] + [handler]
    root.setLevel(level_no)
    for name in _NON_PROPAGATING:
        logger = logging.getLogger(name)
        logger.handlers = [h for h in logger.handlers if not isinstance(h, logging.StreamHandler)] + [handler]

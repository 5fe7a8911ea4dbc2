"""A container's log is one JSON object per line (HOOKBUS_LOG_FORMAT=json, as the image sets):
structlog's lines, FastStream's start and stop lines and other standard-library loggers."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.deploy.manifests import ROOT, dockerfile_env

CODE = """
import logging
from hookbus.services.observability.logs import configure_logging
from faststream._internal.logger import logger as faststream_logger
import structlog
configure_logging()
structlog.get_logger("hookbus.test").info("structlog_line", n=1)
faststream_logger.info("FastStream app starting...")
logging.getLogger("uvicorn.error").warning("a stdlib warning")
logging.getLogger("faststream.hookbus").info("a broker line")
"""


def test_every_line_is_json_in_the_image_log_format():
    env = {"HOOKBUS_LOG_FORMAT": dockerfile_env()["HOOKBUS_LOG_FORMAT"], "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # fails on any non-JSON line
    events = {entry["event"] for entry in entries}
    assert events == {"structlog_line", "FastStream app starting...", "a stdlib warning", "a broker line"}
    assert all(entry["timestamp"].endswith("Z") and entry["level"] for entry in entries)

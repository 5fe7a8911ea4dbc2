"""The offline model in a process of its own: `python -m tests.integration.offline_model_process PORT`.

For tests that measure a service's latency under load: the shared offline model runs in a
thread of the test process, where its work would compete with the test's own loop.
"""

from __future__ import annotations

import sys

import uvicorn

from hookbus.services.testing.offline_model import create_app

if __name__ == "__main__":
    uvicorn.run(create_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")

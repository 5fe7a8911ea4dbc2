"""Put this directory on PYTHONPATH with BENCH_UVLOOP=1 and every Python process of a
bench (the bench itself, `hookbus worker`, the floor worker...) runs asyncio on uvloop,
without touching hookbus: `asyncio.run()` follows the event loop policy set here.

    pip install --target /tmp/bench-uvloop uvloop
    BENCH_UVLOOP=1 PYTHONPATH=/tmp/bench-uvloop:tests/bench/experiments/uvloop_site \\
        .venv/bin/python -m tests.bench.experiments.hop_matrix
"""

import os

if os.environ.get("BENCH_UVLOOP") == "1":
    try:
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - the experiment just runs on asyncio then
        pass

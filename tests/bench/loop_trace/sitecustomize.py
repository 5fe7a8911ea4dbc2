"""Loaded at start-up by every Python process whose PYTHONPATH holds this folder (see
tests/bench/loop_turns.py): with HOOKBUS_LOOP_TRACE set, it logs what the stock asyncio
loop does (each callback it runs, each pass of its selector, each socket read and write)
and writes the log to `$HOOKBUS_LOOP_TRACE.<pid>` at exit. A diagnostic: it slows the
process down, so only counts and shares mean anything, not its times."""

import os

if os.environ.get("HOOKBUS_LOOP_TRACE"):
    from tests.bench.loop_trace_log import install

    install(os.environ["HOOKBUS_LOOP_TRACE"])

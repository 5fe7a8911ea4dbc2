"""The chaos run as a test: 200 requests, replicas and an orchestrator killed at random
(seeded) moments; see tests/bench/chaos.py for the longer run and its figures."""

from __future__ import annotations

import pytest

from tests.bench.chaos import ChaosConfig, run_chaos

pytestmark = pytest.mark.slow


@pytest.mark.timeout(180)
async def test_chaos_every_request_ends_once_and_is_finalized(service_env, tmp_path):
    env = dict(service_env, HOOKBUS_LOG_LEVEL="warning")
    report = await run_chaos(env, tmp_path / "logs", ChaosConfig(requests=200, seed=11, rate=10.0, replica_kills=5))
    print(report.summary())
    assert not report.lost, report.logs
    assert not report.not_exactly_one_terminal, report.logs
    assert not report.never_finalized, report.logs
    assert not report.untouched_not_once, (
        {cid: report.finalize[cid] for cid in report.untouched_not_once}, report.logs,
    )
    assert report.left_pending == 0, (report.pending, report.logs)
    assert sum(k.role == "worker" for k in report.kills) >= 3
    assert sum(k.role == "orchestrator" for k in report.kills) == 1

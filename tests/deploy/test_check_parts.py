"""The parts `make deploy-check` relies on that run without Docker: the stand-in billing
skill, the cheap health probe, and the pip settings handed to the build."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hookbus import Agent, PaymentRequired
from tests.deploy.check.credit_limit import NO_CREDIT_ENV, CreditLimit
from tests.deploy.check.images import SECRET_CA, pip_secrets
from tests.deploy.manifests import ROOT


async def test_credit_limit_refuses_listed_peers_with_a_402_and_serves_the_rest():
    agent = Agent("t", skills=[CreditLimit(no_credit="bob, carol")])
    with pytest.raises(PaymentRequired) as refused:
        await agent.run("hi", auth={"peer_user_id": "bob"})
    assert refused.value.status_code == 402 and refused.value.details == {"peer_user_id": "bob"}
    served = await agent.run("hi", auth={"peer_user_id": "alice"})
    assert served.choices[0].message.content
    anonymous = await agent.run("hi")
    assert anonymous.choices[0].message.content


def test_credit_limit_reads_its_peers_from_the_environment(monkeypatch):
    monkeypatch.setenv(NO_CREDIT_ENV, "bob,dave")
    assert CreditLimit().no_credit == {"bob", "dave"}
    monkeypatch.delenv(NO_CREDIT_ENV)
    assert CreditLimit().no_credit == frozenset()


def test_the_health_probe_does_not_import_the_agent_gateway_or_client():
    """`hookbus health` runs every few seconds in every container: it must start fast."""
    heavy = (
        "hookbus.services.orchestrator",
        "hookbus.services.gateway.app",
        "hookbus.services.gateway.server",
        "hookbus.bus.client",
        "starlette",
        "openai",  # HookData's types: about a second of imports on a busy host, of a probe's ~0.5 s CPU
    )
    code = (
        "import sys, hookbus.services.cli.main, hookbus.services.cli.health; "
        f"print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_pip_settings_reach_the_build_as_secrets_only(tmp_path):
    arguments = pip_secrets(tmp_path)
    secrets = [arguments[i + 1] for i, flag in enumerate(arguments) if flag == "--secret"]
    assert all(s.startswith("id=") for s in secrets) and len(secrets) == len(arguments) // 2
    conf = (tmp_path / "pip.conf").read_text()
    assert conf.startswith("[global]") and "file:" not in conf
    assert (tmp_path / "pip.conf").stat().st_mode & 0o077 == 0
    if any(s.startswith("id=pip-ca,") for s in secrets):
        assert f"cert = {SECRET_CA}" in conf

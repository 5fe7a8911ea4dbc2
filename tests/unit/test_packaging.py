"""The installed shape: one import package, `hookbus`, with its public API and py.typed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import hookbus

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = [
    "Skill", "hook", "tool", "HookData", "Context", "AuthInfo", "HookError",
    "PaymentRequired", "Agent", "CompactionPolicy", "Compaction", "HookbusClient",
    "HookbusError", "ServiceError",
]


def test_the_public_api_is_one_import_away() -> None:
    from hookbus.bus.client import HookbusClient
    from hookbus.services.orchestrator.loop.agent import Agent
    from hookbus.skills import Skill

    assert sorted(hookbus.__all__) == sorted(PUBLIC)
    assert hookbus.Agent is Agent and hookbus.Skill is Skill and hookbus.HookbusClient is HookbusClient


def test_the_wheel_installs_one_top_level_package_with_py_typed_and_the_console_page(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("hookbus-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"hookbus"}
    assert "hookbus/py.typed" in names
    for module in ("hookbus/bus/keys.py", "hookbus/skills/skill.py", "hookbus/services/cli/main.py",
                   "hookbus/skills/builtin/security.py", "hookbus/services/gateway/app.py"):
        assert module in names
    console_files = sorted(p.name for p in (ROOT / "services/console/static").iterdir())
    assert {"index.html", "console.js", "console.css"} <= set(console_files)
    for name in console_files:  # the console's page ships in the wheel: no build step for users
        assert f"hookbus/services/console/static/{name}" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "hookbus = hookbus.services.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_no_module_imports_the_old_top_level_names() -> None:
    offenders = []
    for folder in ("bus", "skills", "services", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                stripped = line.strip()
                if stripped.startswith(("from bus", "from skills", "from services",
                                        "import bus", "import skills", "import services")):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {stripped}")
    assert offenders == []


def test_settings_are_read_when_an_llm_is_built(monkeypatch) -> None:
    from hookbus.services.orchestrator.llm.client import LLM

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    assert LLM().base_url == "http://127.0.0.1:1/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:2/v1")
    assert LLM().base_url == "http://127.0.0.1:2/v1"

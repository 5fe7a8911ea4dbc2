"""deploy/Dockerfile: one slim, non-root, secret-free image whose entrypoint is `hookbus`."""

from __future__ import annotations

import re
import subprocess

from tests.deploy.manifests import (
    DEPLOY,
    ROOT,
    dockerfile_env,
    dockerfile_instructions,
    dockerfile_single,
    exec_form,
    expand_args,
    final_stage,
    healthcheck_command,
    hookbus_executable,
)

SECRET_NAME = re.compile(r"KEY|SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL", re.IGNORECASE)


def test_the_image_is_built_in_two_stages_from_wheels():
    instructions = dockerfile_instructions()
    stages = [expand_args(i.value) for i in instructions if i.keyword == "FROM"]
    assert len(stages) >= 2, stages
    builder = [i for i in instructions if i.stage == 0]
    assert any(i.keyword == "RUN" and "pip wheel" in i.value for i in builder)
    runtime_base = stages[-1].split()[0]
    assert runtime_base == "python:3.11-slim", runtime_base
    installs = [i.value for i in final_stage() if i.keyword == "RUN" and "pip install" in i.value]
    assert installs and all("--no-index" in run for run in installs), installs


def test_the_runtime_stage_has_no_compiler():
    for instruction in final_stage():
        assert "build-essential" not in instruction.value and "gcc" not in instruction.value


def test_the_image_runs_as_a_non_root_user():
    user = dockerfile_single("USER").split(":")[0]
    assert user not in {"root", "0"}, user


def test_one_image_serves_every_role_through_the_hookbus_entrypoint():
    assert exec_form(dockerfile_single("ENTRYPOINT")) == ["hookbus"]
    assert exec_form(dockerfile_single("CMD")) == ["--help"]


def test_the_image_has_a_healthcheck_run_by_hookbus():
    command = healthcheck_command()
    assert command[0] == "hookbus", command
    assert "--timeout=" in dockerfile_single("HEALTHCHECK")


def test_no_secret_is_baked_into_the_image():
    for instruction in dockerfile_instructions():
        if instruction.keyword in {"ENV", "ARG", "LABEL"}:
            assert not SECRET_NAME.search(instruction.value), instruction
        if instruction.keyword in {"COPY", "ADD"}:
            assert not re.search(r"\.env\b|api-keys|\.pem|\.key\b", instruction.value), instruction
    assert "REDIS_URL" not in dockerfile_env()
    assert "OPENAI_API_KEY" not in dockerfile_env()


def test_only_the_sources_are_sent_to_the_build():
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "the context starts empty and lists what it needs"
    for instruction in dockerfile_instructions():
        if instruction.keyword != "COPY" or instruction.value.startswith("--from"):
            continue
        *sources, _destination = instruction.value.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert f"!{source.rstrip('/')}" in {rule.rstrip("/") for rule in rules}, source


def test_the_entrypoint_and_default_command_run_from_the_venv():
    argv = exec_form(dockerfile_single("ENTRYPOINT")) + exec_form(dockerfile_single("CMD"))
    argv[0] = str(hookbus_executable())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "hookbus" in (result.stdout + result.stderr).lower()

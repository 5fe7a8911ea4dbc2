"""The three images the stack runs: a Debian base made by debootstrap (no registry needed),
hookbus from deploy/Dockerfile, and Redis from Debian's package (deploy/redis.Dockerfile).

pip inside the build gets this machine's index settings and CA bundle as BuildKit secrets,
written to a temporary pip.conf: they never reach a layer, the image history or the repo.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from tests.deploy.check.commands import CheckFailed, docker_cli, run

ROOT = Path(__file__).resolve().parents[3]
BASE_IMAGE = "hookbus-base:bookworm"
HOOKBUS_IMAGE = "hookbus:latest"
REDIS_IMAGE = "hookbus-redis:7"
BASE_PACKAGES = "python3,python3-venv,ca-certificates,passwd"
# Trimmed from the debootstrap tree: downloaded .debs, package lists and documentation.
TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SECRET_CA = "/run/secrets/pip-ca"


class Built(BaseModel):
    image: str
    seconds: float
    size_mb: float
    reused: bool = False


def image_exists(image: str) -> bool:
    return run([docker_cli(), "image", "inspect", image], check=False).returncode == 0


def image_size_mb(image: str) -> float:
    size = run([docker_cli(), "image", "inspect", "--format", "{{.Size}}", image]).stdout.strip()
    return round(int(size) / 1e6, 1)


def build_base() -> Built:
    """debootstrap --variant=minbase bookworm, trimmed, imported; reused when already there."""
    if image_exists(BASE_IMAGE):
        return Built(image=BASE_IMAGE, seconds=0.0, size_mb=image_size_mb(BASE_IMAGE), reused=True)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="hookbus-base-", dir="/var/tmp"))
    try:
        tree = work / "rootfs"
        run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", tree], timeout=900)
        for relative in TRIM:
            for entry in (tree / relative).glob("*"):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        tar = subprocess.Popen(
            ["tar", "--sort=name", "--mtime=@0", "--numeric-owner", "-C", str(tree), "-c", "."],
            stdout=subprocess.PIPE,
        )
        imported = subprocess.run(
            [docker_cli(), "import", "--change", f"ENV PATH={BASE_PATH}", "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE],
            stdin=tar.stdout, capture_output=True, text=True, timeout=600,
        )
        if tar.wait() != 0 or imported.returncode != 0:
            raise CheckFailed(f"docker import failed: {imported.stderr.strip()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Built(image=BASE_IMAGE, seconds=round(time.monotonic() - started, 1), size_mb=image_size_mb(BASE_IMAGE))


def pip_settings() -> dict[str, str]:
    """This machine's effective pip settings (`pip config list`, environment last)."""
    listing = run(["python3", "-m", "pip", "config", "list"], check=False).stdout
    settings: dict[str, str] = {}
    for scope in ("global", "install", ":env:"):  # later scopes win
        for line in listing.splitlines():
            key, _, value = line.partition("=")
            where, _, name = key.rpartition(".")
            if where == scope and value:
                settings[name] = value.strip().strip("'\"")
    return settings


def pip_secrets(work: Path) -> list[str]:
    """`--secret` arguments with the index settings and CA this machine's pip uses.

    Only what a build container can reach goes in: http(s) indexes (file:// ones are this
    machine's disk) and the CA bundle, mounted at /run/secrets/pip-ca."""
    settings = pip_settings()
    lines = ["[global]"]
    arguments = []
    cert = settings.get("cert")
    if cert and Path(cert).is_file():
        lines.append(f"cert = {SECRET_CA}")
        arguments += ["--secret", f"id=pip-ca,src={cert}"]
    for name in ("index-url", "extra-index-url", "timeout", "default-timeout", "trusted-host"):
        value = " ".join(part for part in settings.get(name, "").split() if not part.startswith("file:"))
        if value:
            lines.append(f"{name} = {value}")
    conf = work / "pip.conf"
    conf.write_text("\n".join(lines) + "\n")
    conf.chmod(0o600)
    return [*arguments, "--secret", f"id=pip.conf,src={conf}"]


def buildkit(dockerfile: Path, context: Path, tag: str, *arguments: str) -> Built:
    started = time.monotonic()
    run(
        [docker_cli(), "build", "--progress=plain", "-f", dockerfile, *arguments, "-t", tag, context],
        env={"DOCKER_BUILDKIT": "1"}, timeout=1800,
    )
    return Built(image=tag, seconds=round(time.monotonic() - started, 1), size_mb=image_size_mb(tag))


def build_hookbus() -> Built:
    with tempfile.TemporaryDirectory(prefix="hookbus-pip-") as work:
        return buildkit(
            ROOT / "deploy" / "Dockerfile", ROOT, HOOKBUS_IMAGE,
            "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", *pip_secrets(Path(work)),
        )


def build_redis() -> Built:
    return buildkit(
        ROOT / "deploy" / "redis.Dockerfile", ROOT / "deploy", REDIS_IMAGE,
        "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
    )


class ImageFacts(BaseModel):
    user: str
    entrypoint: list[str]
    compilers_and_pip: list[str]
    history_mentions_pip_conf: bool


def inspect_runtime(image: str) -> ImageFacts:
    """What the runtime image holds: its user, and whether any build tool or pip came along."""
    config = json.loads(run([docker_cli(), "image", "inspect", "--format", "{{json .Config}}", image]).stdout)
    probe = run(
        [docker_cli(), "run", "--rm", "--entrypoint", "sh", image, "-c",
         "for tool in gcc cc g++ make pip pip3; do command -v $tool; done; true"],
    ).stdout.split()
    history = run([docker_cli(), "history", "--no-trunc", "--format", "{{.CreatedBy}}", image]).stdout
    return ImageFacts(
        user=config.get("User") or "root",
        entrypoint=config.get("Entrypoint") or [],
        compilers_and_pip=probe,
        history_mentions_pip_conf="index-url" in history or "pip-ca," in history,
    )

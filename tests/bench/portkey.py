"""Portkey's open-source gateway (npm `@portkey-ai/gateway`), the peer of the gateways
bench: where it is installed, installing it, running it, and its hook configurations.

    python -m tests.bench.portkey --install     # into .hookbus/portkey (make bench does this)

It is installed from npm into `.hookbus/portkey/` with `--ignore-scripts`. As published,
1.15.2 with the `@hono/node-server` npm resolves today fails every streamed chat
completion (`TypeError: immutable`, Portkey's issues 1389 and 1550); the install writes
`start-server-streamfix.js` beside its build, a copy in which a streamed Response gets
headers of its own, as their fix (PR 1551) does. No node, or no network for npm: the
install says so and the bench skips Portkey's side, saying why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from tests.bench.common import REPO

VERSION = "1.15.2"
HOME = REPO / ".hookbus" / "portkey"
BUILD = HOME / "node_modules" / "@portkey-ai" / "gateway" / "build"
SERVER = BUILD / "start-server-streamfix.js"
_UNFIXED = "new Response(p,e)}const Ad="
_FIXED = "new Response(p,{status:e.status,statusText:e.statusText,headers:new Headers(e.headers)})}const Ad="


def missing() -> str | None:
    """Why Portkey cannot run here, None when it can."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not SERVER.exists():
        return f"Portkey's gateway is not installed in {HOME} (python -m tests.bench.portkey --install)"
    return None


def install() -> None:
    """npm install the gateway (once) and write its stream-fixed server."""
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed")
    HOME.mkdir(parents=True, exist_ok=True)
    if not (BUILD / "start-server.js").exists():
        if not (HOME / "package.json").exists():
            (HOME / "package.json").write_text(json.dumps({"name": "hookbus-bench-portkey", "private": True}))
        subprocess.run(
            ["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", f"@portkey-ai/gateway@{VERSION}"],
            cwd=HOME, check=True,
        )
    source = (BUILD / "start-server.js").read_text()
    if source.count(_UNFIXED) != 1:
        raise RuntimeError(f"{BUILD / 'start-server.js'} is not the 1.15.2 build the stream fix applies to")
    SERVER.write_text(source.replace(_UNFIXED, _FIXED))


def command(port: int) -> list[str]:
    """One node process, no queue, no auth."""
    return ["node", str(SERVER), "--headless", f"--port={port}"]  # "--port N" is ignored (8787)


def config(upstream: str, hooks: list[dict[str, object]] | None = None) -> str:
    """The `x-portkey-config` header: the OpenAI-compatible `upstream`, and `hooks` run
    before the request."""
    body: dict[str, object] = {"provider": "openai", "api_key": "sk-bench", "custom_host": upstream}
    if hooks:
        body["before_request_hooks"] = hooks
    return json.dumps(body)


def regex_mutator() -> dict[str, object]:
    """The request rewrite in Portkey's process (tests.bench.skills.DARN)."""
    return {"type": "mutator", "id": "mask", "checks": [
        {"id": "default.regexReplace", "parameters": {"rule": "/(?<!\\w)darn(?!\\w)/gi", "redactText": "***"}},
    ]}


def webhook_guardrail(url: str) -> dict[str, object]:
    """The request rewrite out of Portkey's process: its webhook guardrail calling `url`
    (tests.bench.portkey_webhook), which hands back the rewritten request."""
    return {"type": "guardrail", "id": "wh", "deny": True, "checks": [
        {"id": "default.webhook", "parameters": {"webhookURL": url, "timeout": 30000}},
    ]}


if __name__ == "__main__":
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: python -m tests.bench.portkey --install")
    try:
        install()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"Portkey not installed ({exc}): the gateways bench will skip its side", file=sys.stderr)
        sys.exit(0)
    print(f"Portkey {VERSION} ready: {SERVER}")

"""No file of the repository cites a document the repository does not hold: a reader who
follows a cited Markdown file must find it (a design note kept elsewhere is said in the project's
own words or pointed to under docs/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_]*\.md)\b")  # README.md, RESULTS.md, ...
UNDER_DOCS = re.compile(r"(?<![\w/.-])docs/([\w/-]+\.md)\b")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = [ROOT / name for name in names if not name.startswith("tests/deploy/schemas/")]
    return [f for f in files if f.is_file() and f.suffix in {".py", ".ts", ".js", ".md", ".json", ".yml", ".yaml", ".toml", ""}]


def test_every_cited_document_is_in_the_repository() -> None:
    files = tracked_text_files()
    basenames = {f.name for f in files}
    missing = []
    for path in files:
        body = path.read_text(errors="replace")
        missing += [f"{path.relative_to(ROOT)}: {n}" for n in NAMED.findall(body) if n not in basenames]
        missing += [f"{path.relative_to(ROOT)}: docs/{n}" for n in UNDER_DOCS.findall(body) if not (ROOT / "docs" / n).is_file()]
    assert not missing, "documents cited but not in the repository:\n" + "\n".join(missing)

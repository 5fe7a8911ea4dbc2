"""The docs say what the code does: the pages are checked against the code they describe.

`make docs` checks the site's own links (mkdocs --strict); these tests check what mkdocs
cannot: that the functions the architecture walk names exist in the files it names, that
the hook reference lists what each lifecycle point lets a hook change, that every setting
and every package is documented, that the README's links resolve, and that no page talks
about how hookbus was developed instead of what it is.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hookbus.bus.settings import Settings
from hookbus.skills.lifecycle import LIFECYCLES, WRITABLE

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
SOURCE_FOLDERS = ("bus", "services", "skills")


def page(name: str) -> str:
    return (DOCS / name).read_text()


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row that is not a header separator."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[\s|:-]+\|$", line):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def defined_names(path: Path) -> set[str]:
    """`name` for every module-level function or class, `Class.name` for every method."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return names


def walk_steps() -> list[tuple[str, str, list[str]]]:
    """(step, files, functions) of every row of the architecture walk that names files: the
    files comma-separated, each function defined in one of them."""
    steps = []
    for row in table_rows(page("architecture.md")):
        if len(row) == 4 and row[2].endswith(".py`"):
            steps.append((row[0], ", ".join(code_spans(row[2])), code_spans(row[3])))
    return steps


def test_the_walk_covers_the_request_from_the_gateway_to_the_worker_and_back() -> None:
    files = {path for _, paths, _ in walk_steps() for path in paths.split(", ")}
    assert {
        "services/gateway/chat_completions.py", "bus/client.py", "services/orchestrator/serving/service.py",
        "services/orchestrator/serving/admission.py", "services/orchestrator/serving/execution.py",
        "services/orchestrator/loop/agent.py", "services/orchestrator/streaming/turn_stream.py",
        "services/orchestrator/streaming/chunk_pipeline.py", "services/orchestrator/serving/bus_runtime.py",
        "bus/hops/reply_router.py", "services/worker/replica.py", "services/worker/host.py",
        "skills/runner.py", "bus/store/response_stream.py", "services/gateway/sse.py",
    } <= files
    assert len(walk_steps()) >= 50


@pytest.mark.parametrize("step,path,functions", walk_steps(), ids=lambda v: v if isinstance(v, str) else None)
def test_each_step_of_the_walk_names_functions_that_exist_in_its_file(step: str, path: str, functions: list[str]) -> None:
    sources = [ROOT / name for name in path.split(", ")]
    absent = [str(source) for source in sources if not source.is_file()]
    assert not absent, f"step {step}: no file {absent}"
    defined = set().union(*(defined_names(source) for source in sources))
    missing = [name for name in functions if name not in defined]
    assert not missing, f"step {step}: {path} defines no {missing}"


def named(value: object) -> str:
    """A lifecycle or field name, whether the code holds it as a string or a string enum."""
    return str(getattr(value, "value", value))


def test_the_hook_reference_lists_what_each_lifecycle_point_lets_a_hook_change() -> None:
    text = page("hooks.md")
    lifecycles = [named(lifecycle) for lifecycle in LIFECYCLES]
    writable = {named(point): {named(f) for f in fields} for point, fields in WRITABLE.items()}
    glance = {row[0].strip("`"): row for row in table_rows(text) if row[0].strip("`") in lifecycles}
    for lifecycle in lifecycles:
        section = re.search(rf"^## {lifecycle}\n(.*?)(?=^## )", text, re.S | re.M)
        assert section, f"docs/hooks.md has no section '## {lifecycle}'"
        may_change = re.search(r"\*\*May change:\*\* (.*?)(?:[;.]|$)", section.group(1), re.S | re.M)
        assert may_change, f"the {lifecycle} section says nothing under **May change:**"
        documented = set(code_spans(may_change.group(1))) or {"nothing"}
        assert documented == (writable[lifecycle] or {"nothing"}), lifecycle
        assert lifecycle in glance, f"docs/hooks.md's table at a glance has no row for {lifecycle}"
        assert set(code_spans(glance[lifecycle][3])) == writable[lifecycle], lifecycle


def test_every_setting_is_documented() -> None:
    text = page("configuration.md")
    missing = [f.alias for f in Settings.model_fields.values() if f.alias and f"`{f.alias}`" not in text]
    assert not missing, f"docs/configuration.md does not list {missing}"


def test_the_code_layout_names_every_package_and_only_files_that_exist() -> None:
    text = page("layout.md")
    moved, _, _ = text.partition("## Where moved modules went")
    packages = sorted(
        str(init.parent.relative_to(ROOT)) + "/"
        for folder in SOURCE_FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
        if init.parent != ROOT / folder
    )
    missing = [p for p in packages if f"`{p}`" not in text and f"**`{p}`" not in text]
    assert not missing, f"docs/layout.md does not name the packages {missing}"
    for span in code_spans(moved):
        if re.fullmatch(r"(bus|services|skills)/[\w/]+\.py", span):
            assert (ROOT / span).is_file(), f"docs/layout.md names {span}, which does not exist"


def test_the_code_layout_names_every_module() -> None:
    """A module the layout does not name is one a maintainer cannot find by reading it; the
    built-in skills are named in their folder's row by file name."""
    text, _, _ = page("layout.md").partition("## Where moved modules went")
    named = {span for row in table_rows(text) for cell in row for span in code_spans(cell)}
    modules = sorted(
        str(module.relative_to(ROOT))
        for folder in SOURCE_FOLDERS
        for module in (ROOT / folder).rglob("*.py")
        if module.name != "__init__.py" and "node_modules" not in module.parts
    )
    missing = [m for m in modules if m not in named and Path(m).name not in named]
    assert not missing, f"docs/layout.md does not name the modules {missing}"


def test_the_moved_modules_table_goes_from_files_that_are_gone_to_files_that_exist() -> None:
    _, _, moves = page("layout.md").partition("## Where moved modules went")
    rows = [row for row in table_rows(moves) if row[0].endswith(".py`")]
    assert len(rows) >= 40
    for row in rows:
        (old,), (new,) = code_spans(row[0]), code_spans(row[1])
        assert not (ROOT / old).exists(), f"{old} still exists"
        assert (ROOT / new).is_file(), f"{new} does not exist"


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


@pytest.mark.parametrize("path", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_no_page_talks_about_the_development_process(path: Path) -> None:
    found = re.findall(r"\b(?:session|issue|stop) \d+\b", path.read_text(), re.I)
    assert not found, f"{path.name} names {found}: say what hookbus is and does, not how it was built"

"""The README and docs point at things that exist: every relative link resolves, every repository path written
in backticks (`core/engine.py`, `plugins/runner/csrc/`) exists, and no temporary directory is named."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOTS = ("core/", "events/", "plugins/", "benchmarks/", "docs/", "plugin_examples/", "scripts/", "tests/", "testing/",
         ".ci/")


def named_paths(text: str) -> set[str]:
    """Repository paths in backticks; placeholders (`plugins/<name>/`, globs, `{a,b}`) are not paths."""
    out = set()
    for m in re.finditer(r"`([^`\s]+)`", text):
        word = m.group(1).rstrip(".,:;").split("::")[0]   # a pytest node id names its file
        if word.startswith(ROOTS) and not any(c in word for c in "<>*{}$"):
            out.add(word)
    return out


def links(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)", text) if not m.group(1).startswith(("http", "mailto"))}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_named_paths_and_links_exist(page: Path):
    text = page.read_text(encoding="utf-8")
    missing = sorted(p for p in named_paths(text) if not (REPO / p).exists())
    missing += sorted(f"link {t}" for t in links(text) if not (page.parent / t).exists())
    assert not missing, f"{page.relative_to(REPO)} names what does not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_temporary_paths(page: Path):
    text = page.read_text(encoding="utf-8")
    assert "/tmp/" not in text and "/tmp " not in text, f"{page.relative_to(REPO)} names a temporary directory"


def test_the_architecture_walk_names_the_files_of_every_stage():
    names = named_paths((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    for stage_file in ("plugins/http/app.py", "core/entry.py", "core/engine.py", "plugins/scheduler/scheduler.py",
                       "plugins/runner/runner.py", "plugins/runner/batch.py", "plugins/runner/attention.py",
                       "plugins/sampler/sampler.py", "core/output.py", "events/bus.py", "plugins/http/sse.py"):
        assert stage_file in names, stage_file

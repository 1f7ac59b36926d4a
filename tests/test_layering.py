"""The microkernel's layering, read from the source: core/ and events/ import no framework, and a
plugin imports modelcall.core / modelcall.events, never another plugin's modules.

Every import is checked, lazy ones inside functions too: a lazy import of another plugin is still a
dependency on its internals (it breaks when that plugin is blocked with `-p no:NAME` or changes).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = {"torch", "transformers", "aiohttp", "triton", "ray", "numpy"}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def _sources(folder: str) -> list[Path]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no sources under {folder}/"
    return files


@pytest.mark.parametrize("folder", ["core", "events"])
def test_the_kernel_imports_no_framework_and_no_plugin(folder):
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in _sources(folder) for line, mod in _imports(p)
           if mod.split(".")[0] in FRAMEWORKS or mod.startswith("modelcall.plugins")]
    assert not bad, "\n".join(bad)


def test_plugins_depend_on_core_protocols_never_on_another_plugins_internals():
    bad = []
    for path in _sources("plugins"):
        own = path.relative_to(ROOT / "plugins").parts[0]
        for line, mod in _imports(path):
            parts = mod.split(".")
            if parts[:2] == ["modelcall", "plugins"] and len(parts) > 2 and parts[2] != own:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_cross_plugin_import(tmp_path):
    # The scan itself: a lazy import of another plugin inside a function is found.
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from modelcall.plugins.demo_model import build_demo_model\n")
    assert _imports(src) == [(2, "modelcall.plugins.demo_model")]


def test_plugin_examples_use_only_the_public_seams():
    # What a third-party author copies: modelcall.core, modelcall.events and modelcall.testing.
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in _sources("plugin_examples")
           for line, mod in _imports(p)
           if mod.split(".")[0] == "modelcall" and mod.split(".")[:2] not in (
               ["modelcall", "core"], ["modelcall", "events"], ["modelcall", "testing"])]
    assert not bad, "\n".join(bad)

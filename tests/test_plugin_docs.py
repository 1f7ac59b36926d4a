"""The docs stay true: docs/hooks.md is generated from the hook specs, and the tutorial's plugin works as written."""
import importlib
import inspect
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

from modelcall.core import hookspecs
from modelcall.plugins.devtools import hookdocs

ROOT = pathlib.Path(__file__).resolve().parents[1]
REGEN = "python -m modelcall.plugins.devtools.hookdocs > docs/hooks.md"


def test_docs_hooks_md_matches_the_hook_specs():
    current = (ROOT / "docs" / "hooks.md").read_text()
    assert current == hookdocs.render(), f"docs/hooks.md is out of date with core/hookspecs.py; run: {REGEN}"


def _specs() -> dict[str, object]:
    """The hook specs as pluggy sees them, read here without the generator's help."""
    return {n: fn for n, fn in vars(hookspecs).items() if callable(fn) and hasattr(fn, "modelcall_spec")}


def test_every_hook_spec_is_documented_with_its_arguments():
    text = hookdocs.render()
    specs = _specs()
    assert {name for _, name, *_ in hookdocs.hook_specs()} == set(specs)
    sections = dict(re.findall(r"^### `(\w+)`\n(.*?)(?=^###? |\Z)", text, re.S | re.M))
    assert set(sections) == set(specs)
    for name, fn in specs.items():
        doc, section = inspect.getdoc(fn), sections[name]
        assert doc, f"hook {name} has no docstring: the reference would say nothing about it"
        assert f"def {name}({', '.join(inspect.signature(fn).parameters)}): ..." in section, name
        assert doc in section, f"the docstring of {name} is not in its section"
        assert ("`firstresult`" in section) == bool(fn.modelcall_spec.get("firstresult")), name


def test_the_generator_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "modelcall.plugins.devtools.hookdocs"], capture_output=True,
                         text=True, check=True).stdout
    # what REGEN writes is the committed reference, and it has a section per spec
    assert out == (ROOT / "docs" / "hooks.md").read_text()
    assert {f"### `{name}`" for name in _specs()} <= set(out.splitlines())


# ---- the tutorial (docs/plugins.md) builds a plugin that works as written -----------------------

FILE_MARK = re.compile(r"<!-- file: (\S+)[^>]*-->\n```\w*\n(.*?)```", re.S)


def tutorial_files() -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for name, body in FILE_MARK.findall((ROOT / "docs" / "plugins.md").read_text()):
        files.setdefault(name, []).append(body)
    return files


@pytest.mark.anyio
async def test_the_tutorial_plugin_and_its_tests_work_as_written(tmp_path, monkeypatch, make_kernel, events, caplog):
    files = tutorial_files()
    assert set(files) == {"modelcall_slowlog.py", "pyproject.toml", "tests/test_slowlog.py"}
    first, final = files["modelcall_slowlog.py"][0], files["modelcall_slowlog.py"][-1]
    compile(first, "modelcall_slowlog.py (first version)", "exec")
    entry = tomllib.loads(files["pyproject.toml"][-1])["project"]["entry-points"]["modelcall"]
    assert entry == {"slowlog": "modelcall_slowlog"}
    (tmp_path / "modelcall_slowlog.py").write_text(final)
    (tmp_path / "tutorial_test_slowlog.py").write_text(files["tests/test_slowlog.py"][-1])
    monkeypatch.syspath_prepend(str(tmp_path))
    # NOTE: the tutorial's tests are called here with this test's fixtures rather than through an
    # inner pytest run, whose sys.modules restore would make torch import twice.
    tests = importlib.import_module("tutorial_test_slowlog")
    assert tests.pytestmark == pytest.mark.anyio
    names = [n for n in dir(tests) if n.startswith("test_")]
    assert names == ["test_a_fast_request_is_not_logged", "test_a_request_over_the_threshold_is_logged"]
    for name in names:
        caplog.clear()
        events.clear()
        fn = getattr(tests, name)
        fixtures = {"make_kernel": make_kernel, "events": events, "caplog": caplog}
        await fn(**{arg: fixtures[arg] for arg in inspect.signature(fn).parameters})

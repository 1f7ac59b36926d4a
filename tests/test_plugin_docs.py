"""The hook reference in docs/hooks.md is generated from the hook specs and must not drift from them."""
import pathlib
import re
import subprocess
import sys
import tomllib

from modelcall.core import hookspecs
from modelcall.plugins.devtools import hookdocs

ROOT = pathlib.Path(__file__).resolve().parents[1]
REGEN = "python -m modelcall.plugins.devtools.hookdocs > docs/hooks.md"


def test_docs_hooks_md_matches_the_hook_specs():
    current = (ROOT / "docs" / "hooks.md").read_text()
    assert current == hookdocs.render(), f"docs/hooks.md is out of date with core/hookspecs.py; run: {REGEN}"


def test_every_hook_spec_is_documented_with_its_arguments():
    text = hookdocs.render()
    specs = hookdocs.hook_specs()
    assert {name for _, name, *_ in specs} == {n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "modelcall_spec")}
    for _kind, name, sig, doc, _first in specs:
        assert doc, f"hook {name} has no docstring: the reference would say nothing about it"
        assert f"def {name}({', '.join(sig.parameters)})" in text


def test_the_generator_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "modelcall.plugins.devtools.hookdocs"], capture_output=True,
                         text=True, check=True).stdout
    assert out == hookdocs.render()


# ---- the tutorial (docs/plugins.md) builds a plugin that works as written -----------------------

pytest_plugins = ["pytester"]
FILE_MARK = re.compile(r"<!-- file: (\S+)[^>]*-->\n```\w*\n(.*?)```", re.S)


def tutorial_files() -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for name, body in FILE_MARK.findall((ROOT / "docs" / "plugins.md").read_text()):
        files.setdefault(name, []).append(body)
    return files


def test_the_tutorial_plugin_and_its_tests_work_as_written(pytester):
    files = tutorial_files()
    assert set(files) == {"modelcall_slowlog.py", "pyproject.toml", "tests/test_slowlog.py"}
    first, final = files["modelcall_slowlog.py"][0], files["modelcall_slowlog.py"][-1]
    compile(first, "modelcall_slowlog.py (first version)", "exec")
    entry = tomllib.loads(files["pyproject.toml"][-1])["project"]["entry-points"]["modelcall"]
    assert entry == {"slowlog": "modelcall_slowlog"}
    pytester.makepyfile(modelcall_slowlog=final)
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_slowlog.py").write_text(files["tests/test_slowlog.py"][-1])
    pytester.syspathinsert()
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "tests")
    result.assert_outcomes(passed=2)

"""The hook reference in docs/hooks.md is generated from the hook specs and must not drift from them."""
import pathlib
import subprocess
import sys

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

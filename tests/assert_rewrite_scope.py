"""Loaded before the installed pytest plugins (pyproject: `-p assert_rewrite_scope`): pytest rewrites the asserts
of this project's tests and fixtures, not of every module of every installed distribution with a pytest plugin.

NOTE: pytest marks each distribution that ships a pytest11 entry point for assertion rewriting as a whole, so
~570 modules of langsmith, schemathesis, hypothesis and anyio were parsed, rewritten and compiled from source on
every run (with no pytest-tagged .pyc in a fresh checkout or under PYTHONDONTWRITEBYTECODE), not loaded from
their .pyc. Their plugins still load and run as before; only their own asserts stay plain Python asserts.
"""
from __future__ import annotations

import sys

from _pytest.assertion.rewrite import AssertionRewritingHook

for _hook in sys.meta_path:
    # NOTE: _must_rewrite is private (pytest 9.2): the names _mark_plugins_for_rewrite added before any plugin
    # loads. Should pytest rename it, nothing here changes and every plugin module is rewritten, as before.
    marked = getattr(_hook, "_must_rewrite", None) if isinstance(_hook, AssertionRewritingHook) else None
    if isinstance(marked, set):
        marked.intersection_update({name for name in marked if name.split(".")[0] == "modelcall"})

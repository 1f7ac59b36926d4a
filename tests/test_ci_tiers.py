"""How the Makefile's two tiers see the suite (tests/conftest.py): the slow tier imports only the files that name
its marker, and the longest files are handed to the workers first
(the rest keep pytest's order)."""
from __future__ import annotations

from pathlib import Path

import pytest

import conftest

TESTS = Path(__file__).parent


def test_the_slow_tier_imports_every_file_that_holds_a_slow_test(request: pytest.FixtureRequest) -> None:
    # the fast tier collects every file: a slow test in a file the slow tier skips would run in neither tier
    assert request.config.stash[conftest.SLOW_UNSEEN_BY_SLOW_TIER] == []


def test_the_longest_files_come_first_longest_first(request: pytest.FixtureRequest) -> None:
    assert all((TESTS / name).is_file() for name in conftest.LONGEST_FILES), "a renamed or removed file"
    files = list(dict.fromkeys(item.path.name for item in request.session.items))
    first = [f for f in files if f in conftest.LONGEST_FILES]
    assert files[:len(first)] == first, "a file of LONGEST_FILES after another file"
    assert first == sorted(first, key=lambda f: -conftest.LONGEST_FILES[f])

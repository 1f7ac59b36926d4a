"""Where the demo model lives: built in a temporary directory and renamed into place, so a reader
never sees half a model and parallel builders (pytest workers) cannot collide."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from modelcall.plugins.demo_model import build as _build
from modelcall.plugins.demo_model.build import BUILDER_VERSION


def cache_root() -> str:
    root = os.environ.get("MODELCALL_CACHE_DIR")
    if not root:
        import platformdirs
        root = platformdirs.user_cache_dir("modelcall")
    return root


def demo_model_dir() -> str:
    """The cached demo model directory, built first if missing (a few seconds, once per machine)."""
    root = cache_root()
    final = os.path.join(root, f"demo-model-{BUILDER_VERSION}")
    if os.path.isdir(final):
        return final
    os.makedirs(root, exist_ok=True)
    with _lock(os.path.join(root, f".demo-model-{BUILDER_VERSION}.lock")):
        if not os.path.isdir(final):  # another process may have built it while we waited
            build_demo_model(final)
    return final


def build_demo_model(out_dir: str) -> str:
    """Write the demo model into `out_dir` (which must not exist or be empty) atomically:
    everything is written to a sibling temporary directory first, then renamed."""
    out_dir = os.path.abspath(out_dir)
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"{out_dir} is not empty; give a new or empty directory")
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".demo-model-build-", dir=parent)
    try:
        with _quiet_transformers():
            _build.write_demo_model(tmp)
        os.chmod(tmp, 0o755)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o644)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty (checked above); rename onto a non-empty directory fails
        os.rename(tmp, out_dir)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.isfile(os.path.join(out_dir, "config.json")):
            return out_dir  # another process finished first: its files are identical
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


@contextlib.contextmanager
def _lock(path: str) -> Iterator[None]:
    """An exclusive advisory lock across processes (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows: the atomic rename alone keeps readers safe
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()

"""Shared test set-up: one torch thread, the demo model built once per session, anyio on asyncio.

Async test files say `pytestmark = pytest.mark.anyio`.
"""
from __future__ import annotations

import gc
import os
from pathlib import Path

# NOTE: while pytest imports the test modules (transformers, the client SDKs, schemathesis...) the heap grows to
# ~1.2M objects that live as long as the process, and each 25% of growth set off a full collection walking all
# of them: in a whole-suite run 24 of its 31 full collections (4.6 s of 11.4 s) came before the first test.
# The imports make next to no cyclic garbage, so the collector is off until collection ends; then as usual.
gc.disable()

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs on the random-weight demo model (its references); the trained one has its own tests.
os.environ.setdefault("MODELCALL_DEMO_MODEL", "random")

import pytest  # noqa: E402
import torch  # noqa: E402

# The CUDA path's Triton kernels run here in Triton's CPU interpreter (tests/test_triton_*.py, test_cuda_graphs.py).
# Triton reads TRITON_INTERPRET when first imported (transformers imports it; torch does not), so it is set before
# any test module loads: without CUDA only (a GPU machine runs them compiled: tests/test_gpu.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def demo_model_dir() -> str:
    """The demo model directory in the user cache (built on first use, a few seconds)."""
    from modelcall.plugins.demo_model import demo_model_dir as build_or_get
    return build_or_get()


@pytest.fixture(scope="module")
def free_unclosed_async_clients():
    """Collect, at the end of a module, the async SDK clients its third-party clients left open.

    NOTE: an unclosed openai.AsyncOpenAI that is garbage-collected later, while another test's event loop
    runs, schedules its aclose() on that loop (openai's AsyncHttpxClientWrapper.__del__), and the close of
    connections made on a loop that is gone raises "Event loop is closed" inside the other test (seen once:
    test_console_browser's setup). Collected here, with no loop running, __del__ schedules nothing."""
    yield
    import gc
    gc.collect()


# The longest test files, with the seconds each took in CI's run (quiet 2-core machine, both tiers): the Makefile's
# --dist loadfile --no-loadscope-reorder hands files to its two workers in collection order, and a long file
# handed out last holds one worker while the other idles (the slow tier: test_gguf_models, 170 s of its ~400,
# started third, kept it 40 s past an even split). Run first, longest first; the rest follow in file order.
LONGEST_FILES = {
    "test_gguf_models.py": 150, "test_http_errors.py": 60, "test_triton_runner.py": 50, "test_families.py": 47,
    "test_scale_ray.py": 47, "test_gguf_serving.py": 45, "test_agent_lora_demo.py": 39,
    "test_kernel_sanitizers.py": 38, "test_quant_kernels.py": 30, "test_native.py": 22, "test_trained_demo.py": 20,
    "test_tenancy_replicas.py": 18, "test_device_check.py": 16, "test_kernel_isa.py": 16,
    "test_tenant_attacks.py": 16,
}
SLOW_MARK = "mark.slow"   # how a test file that holds slow tests names the marker (pytestmark or a decorator)
# the collected slow tests whose files never name SLOW_MARK (tests/test_ci_tiers.py: none)
SLOW_UNSEEN_BY_SLOW_TIER = pytest.StashKey[list[str]]()


def _names_slow_mark(path: Path) -> bool:
    return SLOW_MARK in path.read_text(encoding="utf-8")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # NOTE: the slow tier (`-m slow`) imports only the files that name the marker: importing all ~140 test files
    # (transformers, the client SDKs, schemathesis...) cost each of its workers ~20 s CPU for 11 files' tests.
    # tests/test_ci_tiers.py checks, in the fast tier's collection of every file, that none of them is skipped.
    if (config.option.markexpr == "slow" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and not _names_slow_mark(collection_path)):
        return True
    return None


@pytest.hookimpl(tryfirst=True)   # before -m deselects: every collected test is seen
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[SLOW_UNSEEN_BY_SLOW_TIER] = sorted(
        i.nodeid for i in items if i.get_closest_marker("slow") and not _names_slow_mark(i.path))
    rank = {name: i for i, name in enumerate(sorted(LONGEST_FILES, key=LONGEST_FILES.__getitem__, reverse=True))}
    items.sort(key=lambda i: rank.get(i.path.name, len(rank)))   # stable: each file's own order is kept


def pytest_collection_finish(session: pytest.Session) -> None:
    # one full pass puts the import heap in the oldest generation at once (else the first young collections
    # after enable() would each walk all of it on its way there)
    gc.collect()
    gc.enable()


def pytest_configure(config: pytest.Config) -> None:
    # NOTE: CI's coverage run blocks the entry-point copy of modelcall's fixtures (-p no:modelcall): pytest
    # imports entry points before pytest-cov starts measuring, and that import pulls in modelcall.core.
    # Loaded here instead, it is measured like the rest.
    if not config.pluginmanager.has_plugin("modelcall"):
        config.pluginmanager.import_plugin("modelcall.testing.fixtures")

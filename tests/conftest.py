"""Shared test set-up: one torch thread, the demo model built once per session, anyio on asyncio.

Async test files say `pytestmark = pytest.mark.anyio`.
"""
from __future__ import annotations

import gc
import os

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

"""One OpenMP team in a serving process: the thread that loads the model frees its team, so the engine's step
thread leads the only one, and the command line sets a short spin of torch's workers before torch loads."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from modelcall.core import KernelConfig
from modelcall.plugins.cli.main import COMPUTE_SPINCOUNT, compute_thread_defaults
from modelcall.plugins.runner import omp_team
from modelcall.plugins.runner.runner import TorchModelRunner
from modelcall.plugins.sampler.sampler import TorchSampler

pytestmark = pytest.mark.skipif(not omp_team.release_thread_team(), reason="torch's OpenMP runtime is not libgomp")


def os_threads() -> int:
    """Threads of this process that Python did not start (OpenMP's workers among them; not tqdm's monitor)."""
    python = {t.native_id for t in threading.enumerate()}
    return sum(int(tid) not in python for tid in os.listdir("/proc/self/task"))


def in_fresh_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a new OS thread (a thread that never led an OpenMP team) and return what it returned."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join()
    return box[0]


@pytest.fixture
def two_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_release_frees_the_calling_threads_team(two_torch_threads):
    x = torch.randn(2048, 2048)

    def lead_a_team_then_release() -> tuple[int, int, int, bool]:
        alone = os_threads()
        x.sum(dim=1)                       # a parallel region: this thread now leads a team of two
        with_team = os_threads()
        released = omp_team.release_thread_team()
        return alone, with_team, os_threads(), released

    alone, with_team, after, released = in_fresh_thread(lead_a_team_then_release)
    assert released
    assert with_team == alone + 1          # the team's second thread
    assert after == alone                  # ... exited


def test_a_two_thread_runner_leaves_no_team_in_its_loading_thread(demo_model_dir, two_torch_threads):
    def load() -> tuple[int, int]:
        before = os_threads()
        runner = TorchModelRunner(KernelConfig(model=demo_model_dir, dtype="bfloat16", threads=2), demo_model_dir,
                                  TorchSampler())
        runner.allocate_kv_cache(64, 16)   # a parallel fill of the cache, after the constructor's release
        return before, os_threads()

    before, after = in_fresh_thread(load)
    assert after == before                 # the loading thread's OpenMP worker is gone: the step thread's is the only one


def test_the_command_line_sets_a_short_spin_unless_one_is_given():
    env: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
    compute_thread_defaults(env)
    assert env["GOMP_SPINCOUNT"] == COMPUTE_SPINCOUNT
    given = {"GOMP_SPINCOUNT": "0"}        # an operator's "never spin" stays
    compute_thread_defaults(given)
    assert given["GOMP_SPINCOUNT"] == "0"

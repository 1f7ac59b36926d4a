"""One OpenMP team in a serving process: the thread that loads the model frees its team, so the engine's step
thread leads the only one, and the command line sets a short spin of torch's workers before torch loads."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
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


def os_threads() -> set[int]:
    """Threads of this process that Python did not start (OpenMP's workers among them; not tqdm's monitor).

    NOTE: compared as sets of ids, not counts: another test's idle thread may exit meanwhile, and its team with it."""
    python = {t.native_id for t in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - python


def settled_threads(baseline: set[int], wait: float = 2.0) -> set[int]:
    """os_threads(), read again for up to `wait` seconds while it holds threads `baseline` lacks.

    NOTE: a Python thread leaves threading.enumerate() a moment before its OS thread ends, so one that a library
    started and finished during the call can still be listed once (a flake, 1 in ~15 runs here); an OpenMP worker
    stays until its team is freed, so a real leftover still shows after the wait."""
    deadline = time.monotonic() + wait
    while True:
        now = os_threads()
        if not (now - baseline) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


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

    def lead_a_team_then_release() -> tuple[set[int], set[int], set[int], bool]:
        alone = os_threads()
        x.sum(dim=1)                       # a parallel region: this thread now leads a team of two
        with_team = os_threads()
        released = omp_team.release_thread_team()
        return alone, with_team, settled_threads(alone), released

    alone, with_team, after, released = in_fresh_thread(lead_a_team_then_release)
    assert released
    assert len(with_team - alone) == 1     # the team's second thread
    assert not (after - alone)             # ... exited


def test_a_two_thread_runner_leaves_no_team_in_its_loading_thread(demo_model_dir, two_torch_threads):
    def load() -> tuple[set[int], set[int]]:
        before = os_threads()
        runner = TorchModelRunner(KernelConfig(model=demo_model_dir, dtype="bfloat16", threads=2), demo_model_dir,
                                  TorchSampler())
        runner.allocate_kv_cache(64, 16)   # a parallel fill of the cache, after the constructor's release
        return before, settled_threads(before)

    before, after = in_fresh_thread(load)
    assert not (after - before)            # the loading thread's OpenMP worker is gone: the step thread's is the only one


def test_the_command_line_sets_a_short_spin_and_huge_pages_unless_given():
    env: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
    compute_thread_defaults(env)
    assert env["GOMP_SPINCOUNT"] == COMPUTE_SPINCOUNT
    assert env["THP_MEM_ALLOC_ENABLE"] == "1"
    given = {"GOMP_SPINCOUNT": "0", "THP_MEM_ALLOC_ENABLE": "0"}   # an operator's "never spin", "no huge pages" stay
    compute_thread_defaults(given)
    assert given == {"GOMP_SPINCOUNT": "0", "THP_MEM_ALLOC_ENABLE": "0"}


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


@pytest.mark.skipif(_thp_mode() == "never", reason="transparent huge pages are off on this machine")
def test_with_the_defaults_a_large_cpu_tensor_sits_on_huge_pages():
    probe = ("import os; from modelcall.plugins.cli.main import compute_thread_defaults; "
             "compute_thread_defaults(os.environ); import torch; x = torch.zeros(64 * 2**20, dtype=torch.uint8); "
             "print(next(int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')))")

    def huge_kb(**env: str) -> int:
        base = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
        out = subprocess.run([sys.executable, "-c", probe], env={**base, "OMP_NUM_THREADS": "1", **env},
                             capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1])

    assert huge_kb() >= 32 * 1024                       # most of the 64 MB tensor
    assert huge_kb(THP_MEM_ALLOC_ENABLE="0") < 32 * 1024   # the operator's "off" is kept

"""The AVX2 kernels (attention_block_avx2.c, attention_decode_avx2.c, attention_rows_avx2.c) run by the whole path that
takes them on a CPU without AVX-512, on this machine: MODELCALL_CPU_ISA=avx2 builds every library with -mno-avx512f
(a cache key of its own), and the plain-decode, cascade / block-attention, decode and fp8 tests run once under it
in a subprocess. Without it an AVX-512 CI machine never runs the AVX2 block kernel nor the AVX2 plain decode step
(tests/test_kernel_avx2.py calls the AVX2 row kernels directly, not through the runner)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from modelcall.plugins.runner import cpu_kernel

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or cpu_kernel.load() is None,
                                reason="x86 with a C compiler only")

# In the subprocess: the kernel it loads is the AVX2 build (block_attention without the AVX-512 block_pairs)
CHECK = ("from modelcall.plugins.runner import cpu_kernel; lib = cpu_kernel.load(); "
         "assert lib is not None and hasattr(lib, 'block_attention') and not hasattr(lib, 'block_pairs'), lib")

# plain decode (the one-call step against the per-call path), cascade and block attention, and the decode rows and
# the fp8 cache against fp64 attention through the runner's entry
TESTS = ["tests/test_plain_decode.py", "tests/test_cascade.py", "tests/test_attention_decode.py", "tests/test_kv_fp8.py"]
AVX512_ONLY = "test_block_attentions_other_bf16_path_equals_masked_softmax_too"


@pytest.mark.slow
# NOTE: the subprocess's own limit (900 s), not the suite's 300 s: the slow tier's two workers share the cores, and
# at a load average of 15-20 here this run took 235 s
@pytest.mark.timeout(1000)
def test_plain_decode_and_block_attention_pass_with_the_avx2_kernels():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MODELCALL_CPU_ISA="avx2", OMP_NUM_THREADS="1")
    check = subprocess.run([sys.executable, "-c", CHECK], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-4000:]
    # (the one AVX-512-only test, which switches the AVX-512 block kernel's bf16 path, left out: it would skip)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, "--deselect", f"tests/test_cascade.py::{AVX512_ONLY}"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-2000:]

"""The C kernels built with AddressSanitizer and UndefinedBehaviorSanitizer (MODELCALL_KERNEL_CFLAGS, a cache key of
their own), and the kernel tests run once over them in a subprocess: a read or write past a buffer, a use after free
or undefined arithmetic in any entry (paged_attention and write_kv over every cache type, decode_layer_attention,
block_attention, the fused ops, row_argmax, the r16 quantized kernels, the decode stack, the encoder's attention and
norm) fails this test with the sanitizer's report.

The subprocess preloads the compiler's libasan (CPython itself is not built with it, and ASan must come first) and
turns leak checking off (CPython keeps its objects at exit by design). UBSan stops at its first report
(-fno-sanitize-recover), so it fails the run rather than printing and going on.
NOTE: shown to catch a bug: write_kv reading one slot past slot_mapping (`t <= n`) fails it with ASan's
heap-buffer-overflow in write_kv (tests/test_attention_decode.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

CC = os.environ.get("CC", "cc")
SANITIZE = "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# The kernel tests that reach every entry of the three libraries (the whole-model greedy tests of test_cascade are
# left to the plain run: their model load is most of their time under the sanitizers)
TESTS = ["tests/test_attention_decode.py", "tests/test_kv_fp8.py", "tests/test_cascade.py", "tests/test_plain_decode.py",
         "tests/test_quant_r16.py", "tests/test_r16f_prefill.py", "tests/test_decode_stack.py", "tests/test_decode_burst_c.py",
         "tests/test_packed_bert.py",
         "tests/test_sampler_greedy_path.py", "tests/test_lean.py::test_rope_without_head_norms_equals_transformers_bit_for_bit",
         "tests/test_lean.py::test_fused_ops_round_where_transformers_modules_round",
         "tests/test_lean.py::test_fused_ops_on_prefill_sized_rows_run_in_parallel_with_the_serial_numbers"]


def _libasan() -> str | None:
    if shutil.which(CC) is None:
        return None
    path = subprocess.run([CC, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.slow
# NOTE: the subprocess's own limit (900 s), not the suite's 300 s: the slow tier's two workers share the cores, and
# at a load average of 15-20 here the sanitizer run took 302 s
@pytest.mark.timeout(1000)
@pytest.mark.skipif(_libasan() is None, reason="no C compiler with AddressSanitizer")
def test_kernel_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # NOTE: the reports go to files: pytest captures fd 2 during a test, and a process the sanitizer ends loses it
    logs = str(tmp_path / "report")
    env = dict(os.environ, MODELCALL_KERNEL_CFLAGS=SANITIZE, LD_PRELOAD=_libasan(), OMP_NUM_THREADS="1",
               ASAN_OPTIONS=f"detect_leaks=0:log_path={logs}", UBSAN_OPTIONS=f"print_stacktrace=1:log_path={logs}")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k", "not greedy_text",
                          *TESTS], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    reports = "".join(open(tmp_path / name).read() for name in sorted(os.listdir(tmp_path)) if name.startswith("report"))
    assert run.returncode == 0 and not reports, (reports[:8000] or "no sanitizer report") + "\n" + run.stdout[-4000:]
    assert " passed" in run.stdout

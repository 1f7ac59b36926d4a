"""core/native.py: every C library builds without a compiler warning (-Wall -Wextra), in the AVX-512 and the AVX2
form; an edited header rebuilds; the environment's flags get their own cache key; a misspelt ISA is an error."""
from __future__ import annotations

import ctypes
import os
import platform
import shutil

import pytest

from modelcall.core import native
from modelcall.plugins.pooling import encoder_ops
from modelcall.plugins.runner import cpu_kernel, decode_stack, fused_ops, quant
from modelcall.plugins.sampler import row_argmax

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")

LIBRARIES = {"paged_attention": cpu_kernel._LIB, "fused_ops": fused_ops._LIB, "row_argmax": row_argmax._LIB,
             "quant_kernels": quant._LIB, "decode_stack": decode_stack._LIB, "encoder_ops": encoder_ops._LIB}
ISAS = [()] + ([("-mno-avx512f",)] if platform.machine() in ("x86_64", "AMD64") else [])


@pytest.mark.parametrize("extra", ISAS, ids=lambda e: " ".join(e) or "native")
@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_every_library_builds_without_a_warning(tmp_path, name, extra):
    assert "-Wall" in native.FLAGS and "-Wextra" in native.FLAGS
    printed = LIBRARIES[name].diagnostics(str(tmp_path), extra)
    assert printed == "", printed


def _library(tmp_path, body: str) -> native.OnceLibrary:
    (tmp_path / "value.h").write_text(f"static inline int value(void) {{ return {body}; }}\n")
    (tmp_path / "lib.c").write_text('#include "value.h"\nint answer(void) { return value(); }\n')

    def declare(lib: ctypes.CDLL) -> None:
        lib.answer.restype = ctypes.c_int
    return native.OnceLibrary("test_native", declare=declare, fallback="-", sources=[str(tmp_path / "lib.c")])


def test_an_edited_header_builds_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELCALL_CACHE_DIR", str(tmp_path / "cache"))
    assert _library(tmp_path, "41").compile().answer() == 41
    assert _library(tmp_path, "42").compile().answer() == 42   # only value.h changed
    assert len(os.listdir(tmp_path / "cache" / "kernels")) == 2


def test_the_source_string_form_still_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELCALL_CACHE_DIR", str(tmp_path))

    def declare(lib: ctypes.CDLL) -> None:
        lib.seven.restype = ctypes.c_int
    once = native.OnceLibrary("test_native_str", "int seven(void) { return 7; }\n", declare, "-")
    assert once.get().seven() == 7


def test_environment_flags_have_their_own_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELCALL_CACHE_DIR", str(tmp_path / "cache"))
    lib = _library(tmp_path, "5")
    plain = lib.compile()._name
    monkeypatch.setenv("MODELCALL_KERNEL_CFLAGS", "-DUNUSED_FOR_THE_TEST=1")
    assert native.env_flags() == ("-DUNUSED_FOR_THE_TEST=1",)
    assert lib.compile()._name != plain
    if platform.machine() in ("x86_64", "AMD64"):
        monkeypatch.setenv("MODELCALL_CPU_ISA", "avx2")
        assert native.env_flags()[0] == "-mno-avx512f"


def test_a_misspelt_isa_is_an_error_not_a_quiet_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELCALL_CPU_ISA", "avx3")
    with pytest.raises(ValueError, match="MODELCALL_CPU_ISA"):
        _library(tmp_path, "1").get()

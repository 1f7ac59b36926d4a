"""Compile small C sources into a shared library once per machine and load it with ctypes.

A service of the core to plugins that carry a C kernel (the runner's attention and fused ops, the sampler's
argmax): it needs only the standard library and a C compiler, and with it no plugin imports another's internals
to build its kernel. A library is built from .c files kept beside its plugin (`sources`, with the folders their
`#include "..."` headers are found in) or from one source string built in Python (`source`).

The library is cached under $MODELCALL_CACHE_DIR (default ~/.cache/modelcall)/kernels, named by a hash of
the source text (every file's, and every header it includes), the compiler and its flags, so an edited .c or .h
builds anew and an unchanged one loads at once.

Environment: MODELCALL_CPU_KERNEL=0 turns every library off; MODELCALL_CPU_ISA=avx2 builds every library without
AVX-512 (the kernels a CPU with AVX2 and no AVX-512 runs, on any x86 machine: how CI tests them); and
MODELCALL_KERNEL_CFLAGS adds flags to every build (tests/test_kernel_sanitizers.py: -fsanitize=address,undefined).
Each changes the cache key, so such builds never mix with the plain ones.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import threading
from typing import Callable, Sequence

log = logging.getLogger("modelcall.runner")

# NOTE: -Wall -Wextra: every library builds without a warning (tests/test_native.py checks each)
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC", "-Wall", "-Wextra")

# headers the plugins' C kernels share (core/csrc: bf16.h): pass include_dirs=(INCLUDE,)
INCLUDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")

# MODELCALL_CPU_ISA: the instruction sets a build may use, as flags after -march=native
ISA_FLAGS = {"native": (), "avx2": ("-mno-avx512f",)}

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


# seconds one compile or link may take before the library counts as unbuildable (its fallback then runs). NOTE: the
# sanitizer build of the quantized kernels (-fsanitize=address,undefined over unrolled AVX-512 intrinsics) took over
# 120 s on a core shared with another test worker, and the library fell back to None mid-suite.
COMPILE_TIMEOUT_S = 600


def cache_dir() -> str:
    root = os.environ.get("MODELCALL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "modelcall")
    return os.path.join(root, "kernels")


def env_flags() -> tuple[str, ...]:
    """The flags the environment adds to every build (MODELCALL_CPU_ISA, MODELCALL_KERNEL_CFLAGS)."""
    isa = os.environ.get("MODELCALL_CPU_ISA", "native") or "native"
    if isa not in ISA_FLAGS:
        raise ValueError(f"MODELCALL_CPU_ISA={isa!r}: expected one of {', '.join(ISA_FLAGS)}")
    return ISA_FLAGS[isa] + tuple(shlex.split(os.environ.get("MODELCALL_KERNEL_CFLAGS", "")))


def _headers(text: str, folder: str, include_dirs: Sequence[str], seen: dict[str, str]) -> None:
    """Every header `text` (a file in `folder`) includes with quotes, found as the compiler finds it (that folder,
    then -I; an absolute path as it is), into `seen` (path -> text), recursively; one not found is the compiler's
    error to report."""
    for name in _INCLUDE.findall(text):
        for where in (folder, *include_dirs):
            candidate = os.path.join(where, name)
            if os.path.isfile(candidate):
                real = os.path.realpath(candidate)
                if real not in seen:
                    with open(real) as f:
                        seen[real] = f.read()
                    _headers(seen[real], os.path.dirname(real), include_dirs, seen)
                break


def source_key(source: str | None, sources: Sequence[str], include_dirs: Sequence[str]) -> str:
    """The text a build's cache key hashes: the source string, each file's name and text, and the text of every
    file they include with quotes (so an edited header rebuilds too)."""
    parts = [source or ""]
    headers: dict[str, str] = {}
    if source is not None:
        _headers(source, os.getcwd(), include_dirs, headers)
    for path in sources:
        with open(path) as f:
            text = f.read()
        parts += [os.path.basename(path), text]
        _headers(text, os.path.dirname(path), include_dirs, headers)
    for path in sorted(headers):
        parts += [os.path.basename(path), headers[path]]
    return "\0".join(parts)


def build(name: str, out_path: str, source: str | None = None, flags: Sequence[str] = FLAGS,
          libs: Sequence[str] = ("-lm",), sources: Sequence[str] = (), include_dirs: Sequence[str] = ()) -> str:
    """Compile `source` (a string) or the files `sources`, one object each, and link them as `out_path` (written
    atomically); returns what the compiler printed (its warnings). Raises CalledProcessError when it fails, with the
    compiler's message in the exception's `stderr`."""
    cc = os.environ.get("CC", "cc")
    out_dir = os.path.dirname(out_path) or "."
    os.makedirs(out_dir, exist_ok=True)
    printed: list[str] = []
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        files = list(sources)
        if source is not None:
            files.append(os.path.join(tmp, f"{name}.c"))
            with open(files[-1], "w") as f:
                f.write(source)
        inc = [f"-I{d}" for d in include_dirs]
        # NOTE: compiled with the flags, linked without -ffast-math: linked with it, gcc adds crtfastmath.o,
        # which sets flush-to-zero/denormals-are-zero for the whole process when the library loads (Python
        # floats then lose their subnormals; hypothesis refuses to run).
        objs = [os.path.join(tmp, f"{i}_{os.path.splitext(os.path.basename(src))[0]}.o") for i, src in enumerate(files)]
        jobs = [subprocess.Popen([cc, *(f for f in flags if f != "-shared"), *inc, "-c", src, "-o", obj],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for src, obj in zip(files, objs)]
        failed = None
        for job in jobs:   # every object at once: seven attention files build in about the time of the largest
            out, err = job.communicate(timeout=COMPILE_TIMEOUT_S)
            printed.append(out + err)
            if job.returncode and failed is None:
                failed = subprocess.CalledProcessError(job.returncode, job.args, out, err)
        if failed is not None:
            raise failed
        tmp_lib = os.path.join(tmp, "lib.so")
        link = subprocess.run([cc, *(f for f in flags if f != "-ffast-math"), *objs, "-o", tmp_lib, *libs],
                              capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=True)
        printed.append(link.stdout + link.stderr)
        os.replace(tmp_lib, out_path)   # atomic: concurrent builders never see half a file
    return "".join(printed)


def compile_library(name: str, source: str | None = None, flags: Sequence[str] = FLAGS,
                    libs: Sequence[str] = ("-lm",), *, sources: Sequence[str] = (),
                    include_dirs: Sequence[str] = ()) -> ctypes.CDLL:
    """`source` (a string) or the files `sources` built with $CC (default cc) and `flags` plus env_flags() as
    <cache>/<name>_<hash>.so and loaded; raises when it cannot be built."""
    if (source is None) == (not sources):
        raise ValueError(f"{name}: give either a source string or source files, not {'both' if sources else 'neither'}")
    flags = (*flags, *env_flags())
    cc = os.environ.get("CC", "cc")
    text = source_key(source, sources, include_dirs)
    key = hashlib.sha256("\0".join([text, cc, *flags, *libs, platform.machine(), sys.platform, "link2"])
                         .encode()).hexdigest()[:16]
    lib_path = os.path.join(cache_dir(), f"{name}_{key}.so")
    if not os.path.exists(lib_path):
        printed = build(name, lib_path, source, flags, libs, sources, include_dirs)
        if printed.strip():
            log.warning("%s: the compiler said:\n%s", name, printed)
    return ctypes.CDLL(lib_path)


class OnceLibrary:
    """A library built and loaded on first use, once per process (thread-safe); None where it cannot be built.

    From a source string, `OnceLibrary(name, source, declare, fallback)`, or from files,
    `OnceLibrary(name, declare=..., fallback=..., sources=[paths], include_dirs=[folders])`. `declare(lib)` sets the
    ctypes signatures. MODELCALL_CPU_KERNEL=0 turns every such library off."""

    def __init__(self, name: str, source: str | None = None, declare: Callable[[ctypes.CDLL], None] | None = None,
                 fallback: str = "", libs: tuple[str, ...] = ("-lm",), *, sources: Sequence[str] = (),
                 include_dirs: Sequence[str] = ()) -> None:
        if declare is None:
            raise TypeError(f"{name}: OnceLibrary needs `declare`, the function that sets the ctypes signatures")
        if (source is None) == (not sources):
            raise ValueError(f"{name}: give either a source string or source files")
        self.name, self.source, self.declare, self.fallback, self.libs = name, source, declare, fallback, libs
        self.sources, self.include_dirs = tuple(sources), tuple(include_dirs)
        self.lib: ctypes.CDLL | None = None
        self._tried = False
        self._lock = threading.Lock()

    def compile(self, extra_flags: Sequence[str] = (), name: str | None = None) -> ctypes.CDLL:
        """This library built (or found in the cache) with `extra_flags` after the usual ones, declared; raises
        when it cannot be built. Tests build variants this way (the AVX2 kernels: extra_flags=("-mno-avx512f",))."""
        lib = compile_library(name or self.name, self.source, (*FLAGS, *extra_flags), self.libs, sources=self.sources,
                              include_dirs=self.include_dirs)
        self.declare(lib)
        return lib

    def diagnostics(self, out_dir: str, extra_flags: Sequence[str] = ()) -> str:
        """What the compiler prints building this library afresh in `out_dir` (no cache): empty when clean."""
        return build(self.name, os.path.join(out_dir, f"{self.name}.so"), self.source,
                     (*FLAGS, *env_flags(), *extra_flags), self.libs, self.sources, self.include_dirs)

    def get(self) -> ctypes.CDLL | None:
        if not self._tried:
            with self._lock:
                if not self._tried:
                    if os.environ.get("MODELCALL_CPU_KERNEL", "1") != "0":
                        env_flags()   # a misspelt MODELCALL_CPU_ISA is an error, not a quiet fallback
                        try:
                            self.lib = self.compile()
                        except Exception as e:  # no compiler, or it failed
                            log.warning("%s unavailable (%s); %s", self.name, _reason(e), self.fallback)
                    self._tried = True
        return self.lib


def _reason(e: Exception) -> str:
    """A failed build's compiler message (its last lines), else the exception itself."""
    err = getattr(e, "stderr", None)
    if isinstance(err, str) and err.strip():
        return f"{e}: {' | '.join(err.strip().splitlines()[-5:])}"
    return str(e)

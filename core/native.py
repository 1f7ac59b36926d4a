"""Compile a small C source into a shared library once per machine and load it with ctypes.

A service of the core to plugins that carry a C kernel (the runner's attention and fused ops, the sampler's
argmax): it needs only the standard library and a C compiler, and with it no plugin imports another's internals
to build its kernel.

The library is cached under $MODELCALL_CACHE_DIR (default ~/.cache/modelcall)/kernels, named by a hash of
the source, the compiler and its flags, so an edited source builds anew and an unchanged one loads at once.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
from typing import Callable

log = logging.getLogger("modelcall.runner")

FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC")


def cache_dir() -> str:
    root = os.environ.get("MODELCALL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "modelcall")
    return os.path.join(root, "kernels")


def compile_library(name: str, source: str, flags: tuple[str, ...] = FLAGS, libs: tuple[str, ...] = ("-lm",)) -> ctypes.CDLL:
    """`source` built with $CC (default cc) as <cache>/<name>_<hash>.so and loaded; raises when it cannot be built."""
    cc = os.environ.get("CC", "cc")
    key = hashlib.sha256("\0".join([source, cc, *flags, *libs, platform.machine(), sys.platform, "link2"]).encode()).hexdigest()[:16]
    out_dir = cache_dir()
    lib_path = os.path.join(out_dir, f"{name}_{key}.so")
    if not os.path.exists(lib_path):
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            src = os.path.join(tmp, f"{name}.c")
            with open(src, "w") as f:
                f.write(source)
            tmp_lib, obj = os.path.join(tmp, "lib.so"), os.path.join(tmp, f"{name}.o")
            # NOTE: compiled with the flags, linked without -ffast-math: linked with it, gcc adds crtfastmath.o,
            # which sets flush-to-zero/denormals-are-zero for the whole process when the library loads (Python
            # floats then lose their subnormals; hypothesis refuses to run).
            subprocess.run([cc, *(f for f in flags if f != "-shared"), "-c", src, "-o", obj], check=True,
                           capture_output=True, timeout=120)
            subprocess.run([cc, *(f for f in flags if f != "-ffast-math"), obj, "-o", tmp_lib, *libs], check=True,
                           capture_output=True, timeout=120)
            os.replace(tmp_lib, lib_path)   # atomic: concurrent builders never see half a file
    return ctypes.CDLL(lib_path)


class OnceLibrary:
    """A library built and loaded on first use, once per process (thread-safe); None where it cannot be built.

    `declare(lib)` sets the ctypes signatures. MODELCALL_CPU_KERNEL=0 turns every such library off."""

    def __init__(self, name: str, source: str, declare: Callable[[ctypes.CDLL], None], fallback: str,
                 libs: tuple[str, ...] = ("-lm",)) -> None:
        self.name, self.source, self.declare, self.fallback, self.libs = name, source, declare, fallback, libs
        self.lib: ctypes.CDLL | None = None
        self._tried = False
        self._lock = threading.Lock()

    def get(self) -> ctypes.CDLL | None:
        if not self._tried:
            with self._lock:
                if not self._tried:
                    if os.environ.get("MODELCALL_CPU_KERNEL", "1") != "0":
                        try:
                            lib = compile_library(self.name, self.source, libs=self.libs)
                            self.declare(lib)
                            self.lib = lib
                        except Exception as e:  # no compiler, or it failed
                            log.warning("%s unavailable (%s); %s", self.name, e, self.fallback)
                    self._tried = True
        return self.lib

"""F16, Q8_0 and Q4_K_M copies of a GGUF file, made by llama.cpp's own quantizer and cached beside it.

    <peer venv python> benchmarks/llama_cpp_quantize.py FILE.gguf [TYPE ...]   (TYPE: F16 Q8_0 Q4_K_M)

Prints one `TYPE PATH` line per type. Runs in the llama.cpp peer's venv (benchmarks/llama_cpp_peer.sh), so
both engines read byte-identical files. A copy is made once: `<stem>.<TYPE>.gguf` beside the source, written
to a temporary name first so an interrupted run leaves no half file behind.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import llama_cpp

# llama_ftype values (llama.h): NOTES.md "llama.cpp as the one-stream peer"
FTYPES = {"F16": 1, "Q8_0": 7, "Q4_K_M": 15}


def copy_path(src: Path, kind: str) -> Path:
    return src.with_name(f"{src.stem}.{kind}.gguf")


def quantize(src: Path, kind: str) -> Path:
    dst = copy_path(src, kind)
    if dst.exists():
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.allow_requantize = True   # the shipped files are already quantized (Q4_1, Q4_K_M)
    params.nthread = int(os.environ.get("QUANTIZE_THREADS", "1"))
    tmp = dst.with_name(dst.name + ".part")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize({src} -> {kind}) failed with status {rc}")
    tmp.rename(dst)
    return dst


def main(argv: list[str]) -> int:
    if not argv or not argv[0].endswith(".gguf") or not Path(argv[0]).is_file():
        print("usage: llama_cpp_quantize.py FILE.gguf [F16 Q8_0 Q4_K_M]", file=sys.stderr)
        return 2
    kinds = argv[1:] or list(FTYPES)
    unknown = [k for k in kinds if k not in FTYPES]
    if unknown:
        print(f"unknown type(s) {unknown}: choose from {list(FTYPES)}", file=sys.stderr)
        return 2
    for kind in kinds:
        print(kind, quantize(Path(argv[0]).resolve(), kind), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

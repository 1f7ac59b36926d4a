#!/usr/bin/env bash
# Wheels for the GPU machine (no network there; docs/gpu.md, issue 16): the project's own wheel plus every
# runtime dependency its image lacks (msgspec, llguidance, ...), for CPython 3.12 on manylinux x86-64,
# into .whl/ (ignored by git). Each dependency is taken at the version this checkout's .venv has, so the
# GPU runs what the CPU tests ran; dependencies of dependencies are followed the same way.
#
#   scripts/build_device_wheels.sh [WHEEL_DIR]      # default .whl
#   DEVICE_PYTHON_VERSION=3.11 scripts/build_device_wheels.sh /tmp/w   # wheels for this machine's Python (a rehearsal)
#
# PRESENT: what the device image already holds (/work/.library/device/KINDS.md, read 2026-11-17);
# those are never carried, torch above all (its CUDA build is there).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/.whl}
PY=${PYTHON:-$ROOT/.venv/bin/python}
mkdir -p "$DIR"
rm -f "$DIR"/modelcall-*.whl
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "$ROOT"
PRESENT="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs build certifi
charset-normalizer click cloudpickle colorama filelock frozenlist fsspec h11 hf-xet httpcore httpx huggingface-hub
idna iniconfig jinja2 joblib markdown markdown-it-py markupsafe mdurl ml-dtypes mpmath msgpack multidict networkx
numpy packaging pandas pathspec pillow pip pluggy prometheus-client propcache protobuf psutil pyarrow pygments
pyparsing python-dateutil pyyaml regex requests rich safetensors scipy sentencepiece setuptools shellingham
simplejson six sympy tiktoken tokenizers torch tqdm transformers triton typer typing-extensions typing-inspect
urllib3 uvloop werkzeug wheel wrapt xxhash yarl zipp pytest pytest-timeout pytest-xdist hypothesis
nvidia-cublas nvidia-cuda-runtime cuda-bindings cuda-toolkit"
"$PY" - "$DIR" "$PRESENT" "${DEVICE_PYTHON_VERSION:-3.12}" <<'PYEOF'
import glob, importlib.metadata as md, re, subprocess, sys, zipfile
from packaging.requirements import Requirement

wheel_dir, present, PYVER = sys.argv[1], set(sys.argv[2].split()), sys.argv[3]

TARGET = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
          "python_version": PYVER, "python_full_version": PYVER + ".0", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "extra": ""}

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
present = {norm(n) for n in present}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)] + ["manylinux2014_x86_64",
                                                                                    "manylinux1_x86_64"]

def requires(whl: str) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(TARGET):   # as on the device: Linux, CPython 3.12
                out.append(norm(req.name))
    return out

have = {norm(w.split("/")[-1].split("-")[0]) for w in glob.glob(f"{wheel_dir}/*.whl")}
todo = requires(glob.glob(f"{wheel_dir}/modelcall-*.whl")[0])
seen = set()
while todo:
    name = todo.pop()
    if name in seen or name in present:
        continue
    seen.add(name)
    if name not in have:
        version = md.version(name)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               PYVER, "--implementation", "cp", "-d", wheel_dir, f"{name}=={version}"]
        for p in PLATFORMS:
            cmd[5:5] = ["--platform", p]
        subprocess.run(cmd, check=True)
        print(f"carried {name}=={version}")
    whl = [w for w in glob.glob(f"{wheel_dir}/*.whl") if norm(w.split("/")[-1].split("-")[0]) == name]
    todo.extend(requires(whl[0]))
PYEOF
ls -la "$DIR"
du -sh "$DIR"

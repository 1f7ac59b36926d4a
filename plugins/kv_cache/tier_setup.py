"""Builds the KV tiers a configuration asks for (`kv_cache_host_gb`, `kv_cache_dir`), or refuses clearly."""
from __future__ import annotations

import hashlib
import os
from typing import Any

from modelcall.core.errors import ConfigError
from modelcall.plugins.kv_cache.block_io import block_io_for
from modelcall.plugins.kv_cache.disk_tier import DiskTier
from modelcall.plugins.kv_cache.fingerprint import fingerprint_fields, fingerprint_of
from modelcall.plugins.kv_cache.host_tier import HostTier
from modelcall.plugins.kv_cache.tiers import KVTiers

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SAMPLE = 1 << 16     # bytes per sample of a weight file
NUM_SAMPLES = 16


def tiers_for(config: Any, spec: Any, runner: Any, model_dir: str | None) -> KVTiers | None:
    host_gb = float(getattr(config, "kv_cache_host_gb", 0.0) or 0.0)
    directory = getattr(config, "kv_cache_dir", None)
    if not directory and host_gb <= 0:
        return None
    if not config.enable_prefix_caching:
        raise ConfigError("the KV tiers (kv_cache_dir, kv_cache_host_gb) keep prefix-cache blocks; "
                          "they need prefix caching on (drop --no-prefix-caching)")
    io = block_io_for(runner, config.block_size)
    host = HostTier(int(host_gb * 2**30), io.block_bytes) if host_gb > 0 else None
    disk = None
    if directory:
        fields = fingerprint_fields(spec, config.block_size, io.layout)
        fields["weights_sample"] = weights_sample(model_dir) if model_dir else ""
        disk = DiskTier(os.path.expanduser(directory), fingerprint_of(fields), fields, io.block_bytes,
                        int(float(config.kv_cache_disk_gb) * 2**30), fsync=config.kv_cache_fsync)
    return KVTiers(io, host, disk)


def weights_sample(model_dir: str) -> str:
    """A hash of each weight file's size and sampled bytes (head, tail, 16 spread samples of 64 KB).

    NOTE: the model identity hashes the config and the weight files' names and sizes only, so two
    fine-tunes of one base look alike to it; in one process that is harmless, on disk it would serve one
    model's K/V to the other. Sampling reads about a MB per file, not the weights."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(WEIGHT_SUFFIXES):
            continue
        path = os.path.join(model_dir, name)
        size = os.path.getsize(path)
        h.update(f"{name}:{size}\0".encode())
        with open(path, "rb") as f:
            step = max(SAMPLE, size // NUM_SAMPLES)
            for at in [*range(0, size, step), max(0, size - SAMPLE)]:
                f.seek(at)
                h.update(f.read(SAMPLE))
    return h.hexdigest()

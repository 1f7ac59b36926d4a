"""The fingerprint a disk block is checked against before it is loaded: what makes K/V bytes usable.

The block key (core/prefix_keys.py: model identity, adapter, cache salt, token ids) says which prefix a
block holds; the fingerprint says whether this process can read its bytes. Both must match. Same model
files served in another compute dtype, another KV dtype (bf16, fp8), block size or paged layout give
other bytes under the same key, so they get another fingerprint and their files are skipped, never loaded.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any


def fingerprint_fields(spec: Any, block_size: int, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, Any]:
    """What the fingerprint covers, as the manifest shows it. `layout`: (dtype, shape of one block's slots)
    of each paged K/V tensor, in the order their bytes are laid out in a block file."""
    return {"model_identity": spec.identity or spec.name, "dtype": spec.dtype, "block_size": block_size,
            "num_layers": spec.num_layers, "layer_windows": list(getattr(spec, "layer_windows", ()) or ()),
            "kv_layout": [[d, list(s)] for d, s in layout]}


def fingerprint_of(fields: dict[str, Any]) -> bytes:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).digest()

"""Hub ids: `--model org/name` resolved to a local snapshot with huggingface_hub.

The cache is huggingface_hub's own (`models--org--name/refs/<revision>`, `snapshots/<sha>/...`), so
what `huggingface-cli download` or vLLM put there is reused. The environment is read at call time
(huggingface_hub reads it once, at import): `HF_HUB_OFFLINE` (never touch the network),
`HF_HUB_CACHE`, else `HF_HOME/hub`; `--download-dir` names another cache folder.
"""
from __future__ import annotations

import logging
import os
import re

from modelcall.core import ModelNotFound

log = logging.getLogger("modelcall.runner")

# What a served checkpoint needs: config, weights (one file or shards with their index), tokenizer,
# chat template. Not .bin/.pth duplicates of the safetensors, nor ONNX/GGUF exports.
ALLOW = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_id(model: str) -> bool:
    """`org/name`, not a path that exists or starts like one (`./x`, `/x`, `~/x`)."""
    return bool(_HUB_ID.fullmatch(model)) and not os.path.exists(model) and ".." not in model


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cache_dir(download_dir: str | None = None) -> str:
    if download_dir:
        return os.path.expanduser(download_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def resolve(model_id: str, revision: str | None = None, download_dir: str | None = None,
            gguf_file: str | None = None) -> str:
    """The local snapshot directory of `model_id` at `revision` (default: main), downloading what is
    missing unless offline; with `gguf_file`, that GGUF file of the repository (and no safetensors). Raises
    ModelNotFound with one line that names the id and what to do."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError,
    )

    cache, off = cache_dir(download_dir), offline()
    at = f"{model_id}@{revision}" if revision else model_id
    try:
        path = snapshot_download(model_id, revision=revision, cache_dir=cache, local_files_only=off,
                                 allow_patterns=[gguf_file, "*.json"] if gguf_file else ALLOW)
    except GatedRepoError:
        raise ModelNotFound(f"{at} is gated on the Hugging Face hub: accept its terms on the model page and "
                            "log in (huggingface-cli login or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{at} is not a model on the Hugging Face hub (nor a local directory); check the "
                            "spelling, or log in if it is private") from None
    except RevisionNotFoundError:
        raise ModelNotFound(f"{model_id} has no revision {revision!r} on the Hugging Face hub") from None
    except LocalEntryNotFoundError:
        if off:
            raise ModelNotFound(f"{at} is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE=1 forbids "
                                f"downloading it: download it first (huggingface-cli download {model_id}"
                                f"{' --revision ' + revision if revision else ''}) or unset HF_HUB_OFFLINE"
                                ) from None
        raise ModelNotFound(f"{at} could not be downloaded (no connection to the Hugging Face hub?) and is not "
                            f"in the cache {cache}: check the network, or set HF_HUB_CACHE / --download-dir "
                            "to a cache that holds it") from None
    except OSError as e:  # network failures below huggingface_hub's own errors, a full disk
        raise ModelNotFound(f"{at}: fetching from the Hugging Face hub failed ({e})") from None
    if not os.path.exists(os.path.join(path, "config.json")) and not any(n.endswith(".gguf") for n in os.listdir(path)):
        raise ModelNotFound(f"{at} (snapshot {path}) has no config.json and no GGUF file: not a checkpoint this "
                            "runner reads")
    log.info("%s resolved to %s", at, path)
    return path

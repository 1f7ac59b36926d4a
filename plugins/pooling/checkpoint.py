"""The checkpoint's own pooling choice, read from its sentence-transformers files:

    modules.json                        Transformer -> Pooling (1_Pooling/) -> Normalize (2_Normalize/)?
    1_Pooling/config.json               pooling_mode_mean_tokens | _cls_token | _lasttoken (v6: pooling_mode)
    sentence_bert_config.json           max_seq_length (inputs longer than this are refused, not cut)
    config_sentence_transformers.json   prompts, default_prompt_name (prepended to text inputs)
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from modelcall.core import ConfigError

# The sentence-transformers module types modelcall runs: anything else (Dense, a second Transformer) would
# change the vector, so a checkpoint that has one is refused rather than served wrong.
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")
MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last"}
MODES_V6 = {"mean": "mean", "cls": "cls", "lasttoken": "last"}


@dataclass(frozen=True, slots=True)
class CheckpointPooling:
    """What the checkpoint's files say (None: the files say nothing, the runner's default applies)."""

    pooling: str | None = None
    normalize: bool | None = None
    max_seq_length: int | None = None
    prefix: str = ""          # the default prompt, prepended to text inputs
    sentence_transformers: bool = False


def read(model_dir: str) -> CheckpointPooling:
    """The pooling choice of `model_dir`; ConfigError for a sentence-transformers pipeline modelcall cannot run."""
    modules_path = os.path.join(model_dir, "modules.json")
    if not os.path.isfile(modules_path):
        return CheckpointPooling()
    modules = _json(modules_path)
    pooling, normalize = None, False
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind not in KNOWN_MODULES:
            raise ConfigError(f"{modules_path}: module {m.get('path') or m.get('name')!r} of type {m.get('type')!r} "
                              f"is not one modelcall runs ({', '.join(KNOWN_MODULES)}); its vectors would differ")
        if kind == "Pooling":
            pooling = _mode(os.path.join(model_dir, m.get("path", ""), "config.json"))
        elif kind == "Normalize":
            normalize = True
    bert = os.path.join(model_dir, "sentence_bert_config.json")
    max_len = _json(bert).get("max_seq_length") if os.path.isfile(bert) else None
    return CheckpointPooling(pooling=pooling, normalize=normalize, max_seq_length=max_len,
                             prefix=_default_prompt(model_dir), sentence_transformers=True)


def _mode(path: str) -> str:
    """The one pooling mode of a Pooling module's config: sentence-transformers 6 writes `pooling_mode`
    ("mean", "cls", "lasttoken", or a list of them), earlier versions one boolean per mode."""
    cfg = _json(path)
    if cfg.get("include_prompt") is False:
        raise ConfigError(f"{path}: include_prompt false (pooling that leaves the prompt's tokens out) is not "
                          "implemented")
    if "pooling_mode" in cfg:
        given = cfg["pooling_mode"]
        names = [given] if isinstance(given, str) else list(given or [])
        on = [MODES_V6.get(n, n) for n in names]
        if len(on) != 1 or on[0] not in MODES.values():
            raise ConfigError(f"{path}: pooling_mode {given!r} — modelcall pools with exactly one of "
                              f"{', '.join(MODES_V6)}")
        return on[0]
    on = [name for key, name in MODES.items() if cfg.get(key)]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in MODES]
    if others or len(on) != 1:
        raise ConfigError(f"{path}: pooling modes {on + others} — modelcall pools with exactly one of "
                          f"{', '.join(MODES)}")
    return on[0]


def _default_prompt(model_dir: str) -> str:
    path = os.path.join(model_dir, "config_sentence_transformers.json")
    if not os.path.isfile(path):
        return ""
    cfg = _json(path)
    name = cfg.get("default_prompt_name")
    return (cfg.get("prompts") or {}).get(name, "") if name else ""


def _json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read it ({e})") from None

"""Plugin module of pooling (entry point `pooling`): the model's pooler (`provide_pooler`) and the encoder runner
for BERT-family checkpoints (`provide_model_runner`, answering only for their model types)."""
from __future__ import annotations

import json
import os
from typing import Any

from modelcall.core import hookimpl


@hookimpl
def provide_model_runner(config: Any, model_dir: str, sampler: Any) -> Any:
    from modelcall.plugins.pooling import checkpoint, encoder
    if encoder.model_type(model_dir) not in encoder.ENCODER_TYPES or not config.wants("runner", "encoder"):
        return None
    return encoder.EncoderRunner(config, model_dir, checkpoint.read(model_dir).max_seq_length)


@hookimpl(trylast=True)
def provide_pooler(config: Any, model_dir: str, runner: Any) -> Any:
    """A sequence-classification encoder scores (ScorePooler); another encoder always pools (default CLS,
    normalized); a decoder pools when its directory has
    sentence-transformers files or `plugin_config["pooling"]` names a pooling (default last-token, normalized).
    The checkpoint's choice wins over the defaults, the configuration over both."""
    from modelcall.plugins.pooling import checkpoint
    from modelcall.plugins.pooling.pooler import HiddenStatePooler, ScorePooler
    ckpt = checkpoint.read(model_dir)
    if getattr(runner, "classifies", False):   # a cross-encoder: rerank and score
        return ScorePooler(runner.num_labels, ckpt.max_seq_length)
    asked = (getattr(config, "plugin_config", None) or {}).get("pooling") or {}
    is_encoder = not getattr(runner, "generates", True)
    if not (is_encoder or ckpt.sentence_transformers or asked.get("pooling")):
        return None
    pooling = asked.get("pooling") or ckpt.pooling or ("cls" if is_encoder else "last")
    normalize = asked.get("normalize", ckpt.normalize if ckpt.normalize is not None else True)
    return HiddenStatePooler(_hidden_size(runner, model_dir), pooling, bool(normalize), ckpt.prefix,
                             ckpt.max_seq_length)


def _hidden_size(runner: Any, model_dir: str) -> int:
    size = getattr(runner, "hidden_size", None)
    if size:
        return int(size)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    return int(cfg.get("hidden_size") or cfg.get("text_config", {}).get("hidden_size"))

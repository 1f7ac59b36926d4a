"""Provides the Hugging Face tokenizer stage (configuration name: "hf")."""
from __future__ import annotations

import os
from typing import Any

from modelcall.core import hookimpl


@hookimpl(trylast=True)
def provide_tokenizer(config: Any, model_dir: str) -> Any:
    if not config.wants("tokenizer", "hf"):
        return None
    from modelcall.plugins.tokenizer_hf import HFTokenizer
    model = getattr(config, "model", None)
    return HFTokenizer(model_dir, tokenizer_dir=getattr(config, "tokenizer_dir", None),
                       chat_template=getattr(config, "chat_template", None),
                       name=model if model and model != model_dir and not os.path.isdir(model) else None)

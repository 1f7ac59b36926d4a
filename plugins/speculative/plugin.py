"""Provides the built-in proposers for `speculative_config.method` "ngram" and "suffix"."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl
from modelcall.plugins.speculative.ngram import NgramProposer
from modelcall.plugins.speculative.suffix import SuffixProposer


@hookimpl(trylast=True)
def provide_proposer(config: Any, spec_config: Any) -> Any:
    if spec_config.method == "ngram":
        return NgramProposer(spec_config.prompt_lookup_min, spec_config.prompt_lookup_max)
    if spec_config.method == "suffix":
        # NOTE: suffix decoding matches longer contexts than prompt lookup (vLLM's default tree depth
        # is 24); prompt_lookup_max still bounds it when set higher than the default.
        return SuffixProposer(spec_config.prompt_lookup_min, max(spec_config.prompt_lookup_max, 8))
    return None

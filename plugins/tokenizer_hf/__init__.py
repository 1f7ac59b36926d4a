"""The built-in tokenizer stage: a Hugging Face fast tokenizer from a local model directory."""
from modelcall.plugins.tokenizer_hf.detok import ByteLevelDetokenizer, WindowDetokenizer
from modelcall.plugins.tokenizer_hf.tokenizer import HFTokenizer

__all__ = ["ByteLevelDetokenizer", "HFTokenizer", "WindowDetokenizer"]

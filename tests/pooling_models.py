"""Tiny embedding checkpoints for the pooling tests, built with the real transformers classes (random weights) and
saved by sentence-transformers itself (modules.json, 1_Pooling/, 2_Normalize/, sentence_bert_config.json), so the
files modelcall reads are the ones a published checkpoint carries."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

CORPUS = ["The cat sits on the mat.", "hello world", "Paged attention keeps the KV cache in fixed-size blocks.",
          "Embeddings map text to vectors; similar texts get similar vectors.", "Le chat dort sur le tapis.",
          "Der Hund schläft im Garten.", "Quarterly revenue rose by eight percent."]
# NOTE: transformers' default 0.02 leaves a tiny random encoder's attention nearly uniform (ModernBERT's [CLS] moved
# by cosine 0.9999 when its padding went unmasked); 0.3 makes each token's state depend on which tokens it sees
INIT = 0.3


def save_sentence_transformer(base: Path, out: Path, pooling: str, max_seq_length: int | None = None) -> str:
    """`base` (a transformers model and tokenizer) wrapped as sentence-transformers does: Transformer -> Pooling
    (`pooling`: mean, cls, lasttoken) -> Normalize, saved to `out`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    word = Transformer(str(base), max_seq_length=max_seq_length)
    dim = word.get_embedding_dimension()
    SentenceTransformer(modules=[word, Pooling(dim, pooling_mode=pooling), Normalize()]).save(str(out))
    return str(out)


def xlm_roberta(tmp: Path, pooling: str = "mean") -> str:
    """An XLMRobertaModel with a real XLMRobertaTokenizer: a sentencepiece-style Unigram vocabulary trained here on
    CORPUS, `<s> A </s>` with `<pad>` = 1 (XLM-R's position ids start after the pad id: 130 positions hold 128
    tokens). No max_seq_length: the model's own limit applies."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizerFast
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizers.NFKC(), pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator(CORPUS * 20, trainers.UnigramTrainer(vocab_size=300, special_tokens=specials,
                                                                   unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    base = tmp / "xlm-roberta-base"
    XLMRobertaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                            cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
                            mask_token="<mask>").save_pretrained(base)
    torch.manual_seed(0)
    XLMRobertaModel(XLMRobertaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128, max_position_embeddings=130,
                                     pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                     initializer_range=INIT)).save_pretrained(base)
    return save_sentence_transformer(base, tmp / "xlm-roberta", pooling)


def modernbert(tmp: Path, bert_tokenizer_dir: str, pooling: str = "cls") -> str:
    """A ModernBertModel (global and local attention layers, rotary positions, no token types) with a BERT
    WordPiece tokenizer (`bert_tokenizer_dir`'s, as ModernBERT's own is a BPE with [CLS]/[SEP] the same way)."""
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel
    base = tmp / "modernbert-base"
    tok = AutoTokenizer.from_pretrained(bert_tokenizer_dir)
    tok.model_input_names = ["input_ids", "attention_mask"]   # ModernBERT takes no token_type_ids
    tok.save_pretrained(base)
    torch.manual_seed(0)
    # NOTE: local_attention 16 with 3 layers (global every 3rd: layer 0 global, 1 and 2 local): inputs longer than
    # the 16-token window make the local layers differ from global attention, so a wrong mask would show
    ModernBertModel(ModernBertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=3,
                                     num_attention_heads=4, intermediate_size=128, max_position_embeddings=256,
                                     local_attention=16, global_attn_every_n_layers=3, pad_token_id=tok.pad_token_id,
                                     cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                                     bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                                     initializer_range=INIT)).save_pretrained(base)
    return save_sentence_transformer(base, tmp / "modernbert", pooling, max_seq_length=256)


def llama_last_token(tmp: Path) -> str:
    """The trained demo decoder (a tiny Llama) with sentence-transformers' files for last-token pooling, no
    Normalize (Qwen3-Embedding's pipeline, minus its normalization, so the vector's norm is checked too)."""
    from modelcall.plugins.demo_model.trained_dir import trained_model_dir
    out = tmp / "tiny-llama-last"
    shutil.copytree(trained_model_dir(), out, dirs_exist_ok=True)
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 128, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_lasttoken": True}))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    return str(out)

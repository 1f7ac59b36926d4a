"""tests/plain_gguf_reader.py, the faster GGUFReader the real-model tests read their files with: every field and
tensor as GGUFReader reads them, and transformers' GGUF loading goes through it inside the context."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from plain_gguf_reader import PlainGGUFReader, transformers_reads_gguf_plainly


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A llama-shaped file with a vocabulary (string, float and int arrays), scalars and three tensor types."""
    path = str(tmp_path_factory.mktemp("plain") / "small.gguf")
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("small")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"tok{i}" for i in range(300)] + ["ünï", ""])
    w.add_token_scores([float(-i) for i in range(302)])
    w.add_token_types([1] * 301 + [3])
    w.add_tensor("token_embd.weight", rng.standard_normal((302, 32), dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float32))
    q8 = gguf.quants.quantize(rng.standard_normal((32, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output.weight", rng.standard_normal((302, 32), dtype=np.float32).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_every_field_and_tensor_is_what_ggufreader_reads(small_gguf: str) -> None:
    want, got = gguf.GGUFReader(small_gguf), PlainGGUFReader(small_gguf)
    assert type(got.data) is np.ndarray and type(want.data) is np.memmap   # the point: no memmap slices
    assert list(got.fields) == list(want.fields)
    for name, w in want.fields.items():
        g = got.fields[name]
        assert (g.offset, g.types, g.data) == (w.offset, w.types, w.data), name
        assert [(p.dtype, p.tobytes()) for p in g.parts] == [(p.dtype, p.tobytes()) for p in w.parts], name
    assert got.fields["tokenizer.ggml.tokens"].contents()[-2:] == ["ünï", ""]
    assert [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in got.tensors] == \
        [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in want.tensors]
    for g, w in zip(got.tensors, want.tensors):
        assert g.data.dtype == w.data.dtype and g.data.shape == w.data.shape and g.data.tobytes() == w.data.tobytes()
        assert np.array_equal(gguf.dequantize(g.data, g.tensor_type), gguf.dequantize(w.data, w.tensor_type))


def test_transformers_reads_the_file_with_it_inside_the_context_only(small_gguf: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    made: list[type] = []
    real_init = gguf.GGUFReader.__init__

    def spy(self, *a, **kw):   # noqa: ANN001, ANN002, ANN003
        made.append(type(self))
        real_init(self, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFReader, "__init__", spy)
        outside = load_gguf_checkpoint(small_gguf)
        with transformers_reads_gguf_plainly():
            inside = load_gguf_checkpoint(small_gguf)
        after = load_gguf_checkpoint(small_gguf)
    assert made == [gguf.GGUFReader, PlainGGUFReader, gguf.GGUFReader]
    assert inside == outside == after
    assert inside["config"]["num_attention_heads"] == 4 and len(inside["tokenizer"]["tokens"]) == 302

"""The greedy lm_head screened at int8 (plugins/runner/head_screen.py, csrc/quant_screen.c): each row's answer is the
first maximum of the logits the head's own kernel computes, on F16, BF16 and Q8_0 heads, fp32 and bf16 activations,
ties and near-ties below int8's resolution; and a real model's greedy tokens are the same with the screen and
without, through the C burst and the Python steps."""
from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch

from modelcall.core import Kernel
from modelcall.plugins.runner import head_screen, quant

pytestmark = pytest.mark.skipif(quant.load() is None or not quant.r16_available(),
                                reason="the screen needs the r16 kernels (AVX-512 VNNI and a C compiler)")

N, K = 4096, 576   # 256 tiles; K as SmolLM2's (18 groups of 32)


def _head(kind: str, w: torch.Tensor) -> quant.QuantLinear:
    n, k = w.shape
    if kind == "Q8_0":
        flat = quant.quantize(w, quant.GGML_TYPES["Q8_0"])
    else:
        half = w.half() if kind == "F16" else w.bfloat16()
        flat = quant.qweight_from_bytes(half.view(torch.uint8).reshape(n, 2 * k), quant.GGML_TYPES[kind], n, k)
    return quant.QuantLinear(quant.repack_r16(flat))


def _first_max(head: quant.QuantLinear, x: torch.Tensor) -> list[int]:
    """What the sampler takes from the head's logits: torch.argmax, the first of equal maxima."""
    return torch.argmax(quant.qmatmul(x, head.qweight), dim=1).tolist()


def _weights(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.04
    w[:, 7] *= 30   # an outlier column, as real heads and hidden states have
    return w


@pytest.mark.parametrize("kind", ["F16", "BF16", "Q8_0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_gets_the_first_maximum_of_the_heads_own_logits(kind, dtype):
    w = _weights(1)
    head = _head(kind, w)
    screen = head_screen.HeadScreen.build(head)
    assert screen is not None and (screen.screen_bytes > 0) == (kind != "Q8_0")
    g = torch.Generator().manual_seed(2)
    for rows in (1, 2, 5, 16, 33):
        if not screen.usable(rows, dtype):   # the head goes dense there; one row reads a Q8_0 head's bytes as it does
            assert (dtype is torch.bfloat16 and rows > quant.DENSE_FROM_TOKENS) or (kind == "Q8_0" and rows == 1)
            continue
        x = torch.randn(rows, K, generator=g) * 2
        # rows leaning towards a vocabulary row, and rows of pure noise (flat logits: many candidate tiles)
        lean = torch.randint(0, N, (rows // 2,), generator=g)
        x[: rows // 2] += w[lean] * 40
        x = x.to(dtype)
        assert screen.argmax(x) == _first_max(head, x), (kind, dtype, rows)


@pytest.mark.parametrize("kind", ["F16", "BF16"])
def test_ties_and_differences_below_int8_keep_the_heads_answer(kind):
    """Rows equal at Q8_0 but not in the head: the int8 estimates tie (their first maximum is the wrong row), the
    head's logits do not; exact duplicates tie in the head too and keep the lower index. A screen that answered from
    its own estimates fails here (one whose bound is zero fails the test above and the real model's)."""
    w = _weights(3)
    w = (w.half() if kind == "F16" else w.bfloat16()).float()   # the head's own values
    target = w[100].clone()
    # element k of group 0 moved to the centre of its Q8_0 step: the same code, another 16-bit value
    d = target[:32].abs().max() / 127
    gap = (torch.round(target[:32] / d) * d - target[:32]).abs()
    gap[target[:32].abs().argmax()] = 0   # not the group's largest: its scale stays
    k = int(gap.argmax())
    later = target.clone()
    later[k] = torch.round(target[k] / d) * d
    w[100], w[3000] = target, later            # rows 100 < 3000, in different tiles
    pair = w[5] * 4
    w[200] = w[2500] = (pair.half() if kind == "F16" else pair.bfloat16()).float()   # an exact duplicate pair
    head = _head(kind, w)
    copy = quant.repack_r16(quant.quantize(head.qweight.dequantize(torch.float32), quant.GGML_TYPES["Q8_0"]))
    assert torch.equal(copy.rows(torch.tensor([100])), copy.rows(torch.tensor([3000])))   # int8 cannot tell them apart
    x = (target * 60).unsqueeze(0)
    x[0, k] = 80.0 * float(torch.sign(later[k] - target[k]))   # a large input where they differ: row 3000 is higher
    exact = _first_max(head, x)
    assert exact == [3000]
    est = quant.qmatmul(x, copy, int8=True)
    assert int(torch.argmax(est)) == 100   # what the estimates alone would answer
    screen = head_screen.HeadScreen.build(head)
    assert screen.argmax(x) == [3000]
    # an exact tie: the duplicate pair, lifted to the top by an x along it
    x2 = (w[200] * 60).unsqueeze(0)
    assert _first_max(head, x2) == [200] and screen.argmax(x2) == [200]


def test_heads_it_does_not_take():
    w = _weights(4)
    plain = quant.QuantLinear(quant.quantize(w, quant.GGML_TYPES["Q8_0"]))   # not r16
    q4 = quant.QuantLinear(quant.repack_r16(quant.quantize(w, quant.GGML_TYPES["Q4_0"])))
    int8 = quant.QuantLinear(quant.repack_r16(quant.quantize(w, quant.GGML_TYPES["Q8_0"])), int8=True)
    biased = quant.QuantLinear(quant.repack_r16(quant.quantize(w, quant.GGML_TYPES["Q8_0"])), bias=torch.ones(N))
    for head in (plain, q4, int8, biased, torch.nn.Linear(K, N)):
        assert head_screen.HeadScreen.build(head) is None
    assert head_screen.HeadScreen.build(_head("Q8_0", w), setting=False) is None
    screen = head_screen.HeadScreen.build(_head("Q8_0", w))
    assert not screen.usable(0, torch.float32) and not screen.usable(head_screen.MAX_ROWS + 1, torch.float32)


# ---- a real model: the same tokens with the screen and without ----

async def _greedy(path: str, prompts: list[list[int]], screen: bool, **config) -> tuple[list, bool]:
    async with Kernel(model=path, dtype="float32", max_model_len=512, max_num_seqs=16,
                      plugin_config={"runner": {"head_screen": "auto" if screen else False}}, **config) as k:
        out: list = [None] * len(prompts)

        async def one(i):
            out[i] = (await k.complete(prompt_token_ids=prompts[i], max_tokens=24, temperature=0.0,
                                       ignore_eos=True)).token_ids
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        return out, k.runner.head_screen is not None


@pytest.mark.anyio
@pytest.mark.parametrize("steps", [None, 1], ids=["bursts", "single-steps"])
async def test_a_real_models_greedy_tokens_are_the_same_with_and_without_the_screen(steps, monkeypatch):
    """SmolLM2-135M-Instruct (its Q8_0 head) with 16 concurrent greedy requests: through the C bursts and through
    single Python steps, the screen runs (every decode batch) and every token equals the full head's."""
    from modelcall.plugins.registry_models import fetch
    path = fetch.ensure("smollm2", quiet=True)
    used = {"rows": 0}
    usable = head_screen.HeadScreen.usable

    def counted(self, rows, dtype):
        ok = usable(self, rows, dtype)
        used["rows"] += rows if ok else 0
        return ok
    monkeypatch.setattr(head_screen.HeadScreen, "usable", counted)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(1000, 40000, int(n)).tolist() for n in rng.integers(8, 40, 16)]
    config = {} if steps is None else {"num_scheduler_steps": steps}
    screened, built = await _greedy(path, prompts, True, **config)
    assert built and used["rows"] > 0
    full, built = await _greedy(path, prompts, False, **config)
    assert not built
    assert screened == full

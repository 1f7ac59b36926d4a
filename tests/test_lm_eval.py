"""lm-evaluation-harness's own `local-completions` model against a live `modelcall serve`: every
logged loglikelihood of a local multiple-choice task equals transformers' for the same tokens
(fp32, within 1e-4), and a generate_until task returns transformers' greedy text for the same prompt."""
from __future__ import annotations

import json
import os

import pytest
import torch

from http_server import ServerThread

# NOTE: before lm-eval imports datasets (which reads it once): local files only, never the hub.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
import lm_eval  # noqa: E402,F401  (the test extra's lm-eval[api]: missing is an error, not a skip)

QUESTIONS = [
    {"question": "def add(a, b):\n    return", "choices": [" a + b", " a - b", " None"], "label": 0},
    {"question": "import os\nprint(os.path.", "choices": ["join", "exists(path))", "sep"], "label": 1},
    {"question": "for i in range(10):\n   ", "choices": [" print(i)", " pass", " break\n"], "label": 2},
    {"question": "class Point:\n    def __init__(self, x, y):\n        self.x =", "choices": [" x", " y"], "label": 0},
]
PROMPTS = [{"prompt": "def fibonacci(n):\n", "target": ""}, {"prompt": "import sys\n\n", "target": ""}]
MAX_GEN = 8

MC_TASK = """task: modelcall_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
"""
GEN_TASK = """task: modelcall_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
target_delimiter: ""
generation_kwargs:
  until: ["\\n\\n\\n"]
  max_gen_toks: {max_gen}
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, rows, yaml in (("mc", QUESTIONS, MC_TASK), ("gen", PROMPTS, GEN_TASK)):
        data = d / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / f"{name}.yaml").write_text(yaml.format(data=data, max_gen=MAX_GEN))
    return str(d)


@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=1024) as s:
        yield s


def _evaluate(server, demo_model_dir, tasks, task: str):
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    lm = LocalCompletionsAPI(base_url=server.base_url + "/v1/completions", model=server.kernel.model_name,
                             tokenizer=demo_model_dir, tokenizer_backend="huggingface", num_concurrent=2,
                             max_retries=1, max_length=1024)
    # NOTE: only the local tasks: indexing lm-eval's thousands of built-in task files costs ~7 s of CPU a call
    out = simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_path=tasks, include_defaults=False),
                          log_samples=True, bootstrap_iters=0)
    return lm, out["samples"][task]


def test_lm_eval_loglikelihoods_equal_transformers(server, demo_model_dir, tasks):
    from transformers import AutoModelForCausalLM

    lm, samples = _evaluate(server, demo_model_dir, tasks, "modelcall_mc")
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    checked = 0
    for sample in samples:
        assert len(sample["resps"]) == len(QUESTIONS[sample["doc_id"]]["choices"])
        for args, resp in zip(sample["arguments"], sample["resps"]):
            context, continuation = (args["arg_0"], args["arg_1"]) if isinstance(args, dict) else args
            ll, is_greedy = resp[0]
            ctx_ids, cont_ids = lm._encode_pair(context, continuation)  # the tokens lm-eval sent
            ids = torch.tensor([ctx_ids + cont_ids])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0].float(), -1)
            want = [lp[len(ctx_ids) + k - 1, t] for k, t in enumerate(cont_ids)]
            assert ll == pytest.approx(float(sum(want)), abs=1e-4), (context, continuation)
            greedy = all(lp[len(ctx_ids) + k - 1].argmax().item() == t for k, t in enumerate(cont_ids))
            assert is_greedy == greedy
            checked += 1
    assert checked == sum(len(q["choices"]) for q in QUESTIONS)
    lls = [resp[0][0] for s in samples for resp in s["resps"]]
    # real scores, not the zeros a server without prompt logprobs gives (every choice then ties)
    assert len(set(lls)) == len(lls) and sum(ll < -1e-3 for ll in lls) >= len(lls) - 2


def test_lm_eval_generate_until_returns_transformers_greedy_text(server, demo_model_dir, tasks):
    from transformers import AutoModelForCausalLM

    lm, samples = _evaluate(server, demo_model_dir, tasks, "modelcall_gen")
    assert len(samples) == len(PROMPTS)
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    for sample in samples:
        ids = lm.tok_encode(PROMPTS[sample["doc_id"]]["prompt"])
        with torch.no_grad():  # the reference: transformers' own greedy decoding of the same tokens
            out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_GEN, do_sample=False, top_k=None,
                                 top_p=None, temperature=None, pad_token_id=model.config.eos_token_id)
        new_ids = out[0, len(ids):].tolist()
        want = lm.tokenizer.decode(new_ids, skip_special_tokens=True).split("\n\n\n")[0]
        assert want and sample["resps"][0][0] == want, (new_ids, want, sample["resps"][0][0])

"""TorchModelRunner: a Hugging Face causal LM run on one flattened batch per step over a paged KV cache."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import msgspec
import torch

from modelcall.core import ConfigError, KernelConfig, SchedulePlan, StepOutput
from modelcall.core.burst import burst_safe
from modelcall.core.plan import kv_groups
from modelcall.core.stages import Sampler
from modelcall.events import now
from modelcall.plugins.runner import (
    attention, cpu_kernel, cuda_graphs, decode_burst, gguf_file, gguf_weights, head_screen, heap, huge_pages, lean,
    lora_runner, omp_team, quant_load, quant_repack,
)
from modelcall.plugins.runner.batch import DecodeState, StepBatch, build_step
from modelcall.plugins.runner.loader import (
    build_spec, check_model_dir, resolve_placement, unsupported_features,
)
from modelcall.plugins.runner.packing import pack_fp32_linears, pack_linears
from modelcall.plugins.runner.verify import sample_with_drafts

log = logging.getLogger("modelcall.runner")


class TorchModelRunner:
    """Loads `model_dir` with transformers' model definitions and modelcall's paged attention.

    NOTE: transformers' own KV cache is never used (`use_cache=False`): with a packed batch it
    would silently attend across requests. The cache is ours: per layer a [slots, Hkv, D] tensor.
    """

    def __init__(self, config: KernelConfig, model_dir: str, sampler: Sampler) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_json = check_model_dir(model_dir)
        if config.threads:
            torch.set_num_threads(config.threads)   # before the dtype probe, which times CPU matmuls
        gguf = gguf_file.marker_of(model_dir)
        self.placement = p = resolve_placement(config, hf_json, gguf=gguf is not None)
        if p.device.type == "cpu" and (config.plugin_config.get("runner") or {}).get("keep_freed_memory", True):
            heap.keep_freed_memory()   # prefill steps stop faulting their activations in afresh (heap.py)
        hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        bad = unsupported_features(hf_config)
        if bad:
            raise ConfigError(f"{model_dir}: the paged attention kernel does not implement {', '.join(bad)}")
        t0 = time.perf_counter()
        if gguf is not None:   # weights from the GGUF file, quantized tensors kept quantized (gguf_weights.py)
            if p.device.type != "cpu":
                raise ConfigError(f"{gguf['gguf_file']}: GGUF weights run on CPU (the quantized kernels are C); "
                                  "use device='cpu'")
            model = gguf_weights.load_model(model_dir, gguf["gguf_file"], gguf["architecture"], p.dtype,
                                            attention.NAME)
        else:
            model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=p.dtype,
                                                         attn_implementation=attention.NAME)
            if config.quantization:
                quant_load.quantize_model(model, config.quantization, p.device)
        model.to(p.device).eval().requires_grad_(False)
        runner_cfg = config.plugin_config.get("runner") or {}
        if p.device.type == "cpu" and quant_repack.enabled(runner_cfg.get("repack", "auto")):
            quant_repack.repack_model(model)   # decode near the memory's rate (quant_repack.py)
        if quant_repack.enabled(runner_cfg.get("int8_activations", False)):
            quant_repack.use_int8_activations(model)
        self.weight_bytes = quant_load.resident_weight_bytes(model)
        if not getattr(model, "_supports_attention_backend", False):
            raise ConfigError(f"{type(model).__name__} does not route attention through transformers' "
                              "AttentionInterface; the torch runner cannot page its KV cache")
        if p.device.type == "cpu" and p.dtype == torch.bfloat16:
            pack_linears(model, batch_hint=min(config.max_num_seqs, 64))
        elif p.device.type == "cpu" and p.dtype == torch.float32:
            pack_fp32_linears(model, batch_hint=min(config.max_num_seqs, 64))
        self.model = model
        self.base = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(hf_config, "final_logit_softcapping", None)
        # What the family's ForCausalLM.forward does to the logits after lm_head (the runner calls lm_head
        # itself): Granite divides by logits_scaling, Cohere multiplies by logit_scale.
        self.logit_mult = _logit_multiplier(model, hf_config)
        self.sampler = sampler
        # The paged group's attention: the Triton kernel on CUDA (plugins/runner/cuda_attention.py), else None
        # (attention.py's C kernel on CPU, the portable torch path elsewhere); runner `attention` forces one.
        self.attention_backend = None
        if p.device.type == "cuda" or runner_cfg.get("attention") == "triton":
            from modelcall.plugins.runner import cuda_attention
            self.attention_backend = cuda_attention.choose_backend(runner_cfg.get("attention"), p.device)
        # Decode through bucketed static batches (plugins/runner/cuda_graphs.py): runner cuda_graphs true (captured
        # CUDA graphs) or "eager" (the same buffers uncaptured); off by default.
        self.graph_mode = cuda_graphs.mode_of(runner_cfg.get("cuda_graphs"), p.device)
        self.graph_cfg = (runner_cfg, config.max_num_seqs)
        self.graphs: cuda_graphs.DecodeGraphs | None = None
        self.spec = build_spec(model_dir, config, hf_config, hf_json, p, self.probe_layer_windows(hf_config))
        self.groups = kv_groups(self.spec.layer_windows, self.spec.num_layers)
        self.group_size = max(len(g.layers) for g in self.groups)
        self.layer_group = [0] * self.spec.num_layers
        self.layer_member = [0] * self.spec.num_layers
        for gi, g in enumerate(self.groups):
            for m, layer in enumerate(g.layers):
                self.layer_group[layer], self.layer_member[layer] = gi, m
        # modelcall's own decoder loop (plugins/runner/lean.py) for Llama-like families on CPU; None: the HF modules
        self.lean: lean.LeanStack | None = None
        if self.attention_backend is None and not self.graph_mode:
            self.lean = lean.build(model, self.base, hf_config, self.spec.layer_windows, runner_cfg.get("lean", "auto"),
                                   runner_cfg.get("lean_epilogues", "auto"), runner_cfg.get("lean_plain_decode", "auto"),
                                   runner_cfg.get("lean_decode_stack", "auto"), runner_cfg.get("huge_pages", True))
        # LoRA adapters on this base model (plugins/runner/lora_runner.py); None: LoRA off (the kernel's catalog: loras)
        self.lora: lora_runner.RunnerLora | None = None
        if config.lora_enabled:
            self.lora = lora_runner.RunnerLora(model, self.base, self.lean, config, p.dtype, p.device)
        self.loras = self.lora.registry if self.lora is not None else None
        # the weights a decode step streams, on 2 MiB pages (huge_pages.py; the lean stack moves its own before its
        # decode stack takes their addresses); runner huge_pages false: left where they were allocated
        self.huge_pages = self.lean.rehomed if self.lean is not None else None
        if self.lean is None and p.device.type == "cpu" and runner_cfg.get("huge_pages", True):
            self.huge_pages = huge_pages.rehome(huge_pages.module_tensors(model))
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.block_size = 0
        self.decode_state = DecodeState()   # consecutive decode steps of the same requests: updated, not rebuilt
        # the greedy head screened at int8 (head_screen.py), after every move of the head's bytes (huge pages);
        # runner head_screen false: a greedy row's whole head is computed
        self.head_screen = (head_screen.HeadScreen.build(self.lm_head, runner_cfg.get("head_screen", "auto"))
                            if p.device.type == "cpu" and self.logit_mult is None and not self.softcap else None)
        if self.head_screen is not None:
            self.weight_bytes += self.head_screen.screen_bytes
        # a greedy decode burst in one C call (decode_burst.py); runner decode_burst false: Python steps
        self.greedy_burst = (decode_burst.GreedyBurst.build(self) if runner_cfg.get("decode_burst", "auto")
                             not in (False, "off", "false") else None)
        self._cpus = cpu_binding(config) if p.device.type == "cpu" else []
        self._bound = threading.local()   # binding is per OS thread: anyio may hand execute() a new worker
        log.info("loaded %s on %s (%s, kv %s; weights %.1f MB%s) in %.1fs", gguf["gguf_file"] if gguf else model_dir,
                 p.device, p.dtype, p.kv_dtype, self.weight_bytes / 1e6,
                 f", GGUF {os.path.getsize(gguf['gguf_file']) / 1e6:.1f} MB" if gguf else
                 (f", quantized at load to {config.quantization}" if config.quantization else ""),
                 time.perf_counter() - t0)
        self._release_load_team()

    def probe_layer_windows(self, hf_config: Any) -> tuple[int, ...]:
        """Each layer's sliding window (0: full) as the model itself passes it to attention, from one
        two-token forward that records and computes nothing in attention.

        NOTE: observed, not read from the config: a stray `sliding_window` key in a config.json of a family
        that ignores it must not make the KV policy free blocks a layer still reads. A layer that never
        calls attention (state-space or recurrent layers) keeps state this runner does not page: refused.
        """
        n = int(hf_config.num_hidden_layers)
        seen: dict[int, int] = {}
        dev = self.placement.device
        step = StepBatch(input_ids=torch.tensor([[1, 2]], device=dev), positions=torch.tensor([[0, 1]], device=dev),
                         slot_mapping=torch.zeros(2, dtype=torch.long, device=dev), sample_rows=None, num_sampled=0,
                         num_paged=0, scratch={"probe_windows": seen})
        step.kv = [(torch.empty(0), torch.empty(0))] * n
        with torch.inference_mode():
            self.base(input_ids=step.input_ids, position_ids=step.positions, use_cache=False, modelcall_step=step)
        missing = [i for i in range(n) if i not in seen]
        if missing:
            raise ConfigError(f"{type(self.model).__name__}: layers {missing[:8]} do not call attention (state-space "
                              "or recurrent layers?); the torch runner pages attention K/V only")
        return tuple(seen[i] for i in range(n))

    # ---- KV cache -----------------------------------------------------------------------------

    def kv_block_bytes(self, block_size: int) -> int:
        s = self.spec
        return 2 * self.group_size * block_size * s.num_kv_heads * s.head_dim * self.placement.kv_dtype.itemsize

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """One [group_size, 2, slots, Hkv, D] tensor: a block holds `group_size` layers' K/V. With one KV group
        (every layer alike) that is every layer; with several, layer l uses row `member[l]`, placed by its
        group's block table (core.kv_groups)."""
        s = self.spec
        extra = 1 if self.graph_mode else 0   # decode graphs: one dummy block for padding rows, never handed out
        shape = (self.group_size, 2, (num_blocks + extra) * block_size, s.num_kv_heads, s.head_dim)
        # NOTE: zeros, not empty: padded attention reads unused slots (masked out) and NaN garbage
        # would still poison masked SDPA rows through 0 * NaN.
        cache = torch.empty(shape, dtype=self.placement.kv_dtype, device=self.placement.device)
        if cache.device.type == "cpu":   # K/V reads of a decode step on 2 MiB pages (huge_pages.py)
            huge_pages.advise(cache)
        cache.zero_()
        self.kv = [(cache[m, 0], cache[m, 1]) for m in self.layer_member]
        self.block_size = block_size
        if self.graph_mode:
            self.graphs = cuda_graphs.for_runner(self, num_blocks, block_size)
        self._release_load_team()

    def _release_load_team(self) -> None:
        """Loading ran parallel torch ops in the loading thread; steps run in another (the engine's worker). Free
        the loading thread's OpenMP team so the step thread's is the only one: with two, libgomp stops spinning
        between the small GEMMs of a decode step (plugins/runner/omp_team.py)."""
        if self.placement.device.type == "cpu" and torch.get_num_threads() > 1:
            omp_team.release_thread_team()

    # ---- one step ------------------------------------------------------------------------------

    def execute(self, plan: SchedulePlan) -> StepOutput:
        t0 = time.perf_counter()
        if self._cpus and not getattr(self._bound, "done", False):
            self._bound.done = True
            if cpu_kernel.bind_threads(self._cpus):
                log.info("compute threads of %s pinned to CPUs %s", threading.current_thread().name, self._cpus)
        if plan.num_steps > 1:
            return self._execute_burst(plan, t0)
        scored: list[tuple[int, list[Any], list[int]]] = []
        pooled: dict[int, Any] = {}
        with torch.inference_mode():
            screen = self._screen_for(plan)
            if screen is not None:   # every sampled row a plain greedy choice: the screen's first maxima
                screened = screen.argmax(self._step_hidden(plan, self._build(plan), scored, pooled))
            else:
                logits = self.compute_logits(plan, scored, pooled)
            if plan.block_copies:
                self._copy_blocks(plan.block_copies)
            sampled = [c for c in plan.chunks if c.sample]
            spec = None
            if screen is not None:
                ids, logprobs = screened, None
            elif plan.num_draft_tokens:
                ids, logprobs, spec = sample_with_drafts(self.sampler, logits, sampled)
            elif sampled:
                ids, logprobs = self.sampler.sample(logits, sampled)
            else:
                ids, logprobs = [], None
        token_ids: list[int | None]
        lps: list[Any] | None
        if len(sampled) == len(plan.chunks):   # every chunk sampled (a decode step): the sampler's order is the plan's
            token_ids, lps = list(ids), (list(logprobs) if logprobs is not None else None)
        else:
            token_ids = [None] * len(plan.chunks)
            lps = [None] * len(plan.chunks) if logprobs is not None else None
            j = 0
            for i, c in enumerate(plan.chunks):
                if c.sample:
                    token_ids[i] = ids[j]
                    if lps is not None:
                        lps[i] = logprobs[j]
                    j += 1
        out = StepOutput(token_ids=token_ids, logprobs=lps, forward_s=time.perf_counter() - t0)
        if spec is not None:
            out.spec_tokens = [None] * len(plan.chunks)
            j = 0
            for i, c in enumerate(plan.chunks):
                if c.sample:
                    out.spec_tokens[i] = spec[j]
                    j += 1
        if pooled:
            out.pooled = pooled
        if scored:
            out.prompt_logprobs = [None] * len(plan.chunks)
            out.prompt_ranks = [None] * len(plan.chunks)
            for i, plp, ranks in scored:
                out.prompt_logprobs[i], out.prompt_ranks[i] = plp, ranks
        return out

    def burst_steps(self, plan: SchedulePlan) -> int:
        """The most steps of decode `plan` one `execute` runs (core/burst.py): any number on the CPU path with one KV
        group (its DecodeState feeds a step's tokens to the next) and a sampler that says it may (`burst_safe`), 1
        elsewhere (CUDA graphs, sliding-window groups, adapter rows)."""
        if self.placement.device.type != "cpu" or self.graphs is not None or len(self.groups) != 1:
            return 1
        if not getattr(self.sampler, "burst_safe", False):
            return 1
        if self.lora is not None and lora_runner.plan_has_lora(plan):
            return 1
        return 1 << 30

    def _execute_burst(self, plan: SchedulePlan, t0: float) -> StepOutput:
        """Decode `plan` up to `plan.num_steps` steps, each fed the last one's tokens (the requests are not told
        them: the engine applies the burst after, core/burst.py). Stops early where the decode state cannot advance
        (a context past its slot capacity): the steps run are the answer."""
        steps: list[list[int]] = []
        ends: list[float] = []
        with torch.inference_mode():
            step: StepBatch | None = build_step(plan, self.block_size, self.placement.device, 1, self.decode_state)
            if (step is not None and self.greedy_burst is not None and self.greedy_burst.usable(plan, self.sampler)
                    and step.last_rows == list(range(len(plan.chunks)))):   # one row a request, in plan order
                # every step in C (decode_burst.py), from the inputs the step just built holds
                done = self.greedy_burst.run(self.decode_state, step.input_ids[0].tolist(), step.positions[0].tolist(),
                                             plan.num_steps, self.block_size, self.kv, self.spec.layer_windows)
                if done is not None:
                    steps, ends = done
                    return StepOutput(token_ids=list(steps[0]), forward_s=time.perf_counter() - t0, burst=steps,
                                      burst_ts=ends)
            screen = self._screen_for(plan)
            while step is not None:
                if screen is not None:
                    ids = screen.argmax(self._step_hidden(plan, step))
                else:
                    ids, _ = self.sampler.sample(self._step_logits(plan, step), plan.chunks)
                steps.append(list(ids))
                ends.append(now())
                if len(steps) == plan.num_steps:
                    break
                step = self.decode_state.advance(steps[-1], self.block_size)
        return StepOutput(token_ids=list(steps[0]), forward_s=time.perf_counter() - t0, burst=steps, burst_ts=ends)

    def compute_logits(self, plan: SchedulePlan, scored: list | None = None, pooled: dict | None = None) -> torch.Tensor:
        """Forward `plan` (writing its K/V) and return the logits of the sampled chunks, plan order, in the
        model's dtype (the sampler upcasts when it does more than take the maximum). With `scored`, the
        prompt logprobs the plan's chunks ask for go there as (chunk index, logprobs, ranks); with `pooled`, the
        hidden-state rows of pooling chunks as chunk index -> float32 host tensor (core/pooling.py)."""
        # NOTE: no K/V yet is _build's error (CUDA graphs exist only after allocate_kv_cache)
        with torch.inference_mode():
            if self.graphs is not None and self.graphs.supports(plan, len(self.groups)) and not (
                    self.lora is not None and lora_runner.plan_has_lora(plan)):   # decode: static batches
                return self.graphs.logits(plan)
            return self._step_logits(plan, self._build(plan), scored, pooled)

    def _build(self, plan: SchedulePlan) -> StepBatch:
        """The flattened step of `plan` (its K/V allocated)."""
        if not self.kv:
            raise RuntimeError("allocate_kv_cache() must be called before execute()")
        return build_step(plan, self.block_size, self.placement.device, len(self.groups), self.decode_state)

    def _screen_for(self, plan: SchedulePlan) -> head_screen.HeadScreen | None:
        """The head's int8 screen where every row `plan` samples is the first maximum of its logits (a greedy
        request the sampler would take the argmax of: no logprobs, penalties, processors or pending min_tokens; no
        drafts, adapters, pooling) and the screen takes that many rows; else None."""
        screen = self.head_screen
        if (screen is None or self.graphs is not None or plan.num_draft_tokens
                or not getattr(self.sampler, "greedy_argmax", False)
                or (self.lora is not None and lora_runner.plan_has_lora(plan))):
            return None
        rows = 0
        for c in plan.chunks:
            req = c.request
            if not req.params.greedy or req.pooling is not None or not burst_safe(req):
                return None
            rows += bool(c.sample)
        return screen if screen.usable(rows, self.placement.dtype) else None

    def _step_logits(self, plan: SchedulePlan, step: StepBatch, scored: list | None = None,
                     pooled: dict | None = None) -> torch.Tensor:
        """compute_logits of `step`, `plan` flattened (in inference mode)."""
        return self._head(self._step_hidden(plan, step, scored, pooled))

    def _step_hidden(self, plan: SchedulePlan, step: StepBatch, scored: list | None = None,
                     pooled: dict | None = None) -> torch.Tensor:
        """The final hidden rows of `step`'s sampled chunks, plan order (the lm_head's input), its forward run."""
        step.kv = self.kv
        step.scratch["layer_windows"] = self.spec.layer_windows   # attention checks each layer's against it
        if self.attention_backend:
            step.scratch.update(attention_backend=self.attention_backend, block_size=self.block_size)
        if len(self.groups) > 1:
            step.scratch["layer_group"] = self.layer_group
        if self.lora is not None:
            self.lora.begin(plan, step)
        try:
            hidden = self._forward(step)
        finally:
            if self.lora is not None:
                self.lora.end()
        if scored is not None and step.prompt_rows is not None:
            scored.extend(self._score_prompt(hidden, step))
        if pooled is not None and step.pool_spans:
            pooled.update((i, hidden[a:a + n].float().cpu()) for i, a, n in step.pool_spans)
        if step.num_sampled == 0:   # only partial prefill chunks: nothing to sample
            return hidden[:0]
        if step.sample_rows is not None:
            hidden = hidden.index_select(0, step.sample_rows)
        return hidden

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of `hidden` rows as the family's ForCausalLM computes them after its decoder."""
        logits = self.lm_head(hidden)
        if self.logit_mult is not None:
            logits = logits * self.logit_mult
        if self.softcap:
            logits = torch.tanh(logits.float() / self.softcap) * self.softcap
        return logits

    def _score_prompt(self, hidden: torch.Tensor, step: StepBatch, rows_per_pass: int = 512) -> list[tuple[int, list, list]]:
        """Prompt logprobs from the logits at the asked rows of this forward (no second pass over the
        prompt); the lm_head runs on `rows_per_pass` rows at a time to bound the [rows, vocab] memory."""
        score = getattr(self.sampler, "prompt_logprobs", None)
        if score is None:
            raise RuntimeError(f"the sampler {type(self.sampler).__name__} cannot score prompt tokens "
                               "(it has no prompt_logprobs method)")
        num_top = max(top for _, _, top in step.prompt_spans)
        lps: list[Any] = []
        ranks: list[int] = []
        rows, targets = step.prompt_rows, step.prompt_targets
        for a in range(0, len(targets), rows_per_pass):
            logits = self._head(hidden.index_select(0, rows[a:a + rows_per_pass]))
            lp, rk = score(logits, targets[a:a + rows_per_pass], num_top)
            lps.extend(lp)
            ranks.extend(rk)
        out, at = [], 0
        for i, n, top in step.prompt_spans:
            part = lps[at:at + n]
            if top < num_top:
                part = [msgspec.structs.replace(p, top=p.top[:top]) for p in part]
            out.append((i, part, ranks[at:at + n]))
            at += n
        return out

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy on write: the K/V of each source block into its destination block, every layer."""
        bs = self.block_size
        src = torch.cat([torch.arange(s * bs, (s + 1) * bs) for s, _ in copies]).to(self.placement.device)
        dst = torch.cat([torch.arange(d * bs, (d + 1) * bs) for _, d in copies]).to(self.placement.device)
        for k, v in self.kv:
            k.index_copy_(0, dst, k.index_select(0, src))
            v.index_copy_(0, dst, v.index_select(0, src))

    def _forward(self, step: StepBatch) -> torch.Tensor:
        if self.lean is not None:
            return self.lean.forward(step)
        out = self.base(input_ids=step.input_ids, position_ids=step.positions, use_cache=False,
                        modelcall_step=step)
        return out.last_hidden_state[0]

    def close(self) -> None:
        self.kv = []
        self.model = None  # type: ignore[assignment]
        if self.placement.device.type == "cuda":
            torch.cuda.empty_cache()


def _logit_multiplier(model: torch.nn.Module, hf_config: Any) -> float | None:
    scaling = getattr(hf_config, "logits_scaling", None)
    if scaling not in (None, 1, 1.0):
        return 1.0 / float(scaling)
    scale = getattr(model, "logit_scale", None)
    if isinstance(scale, (int, float)) and scale != 1:
        return float(scale)
    return None


def cpu_binding(config: KernelConfig) -> list[int]:
    """CPUs to pin the compute threads to, from `plugin_config["runner"]["cpu_bind"]`: "auto" (the first
    `threads` CPUs this process may use), a list of CPU ids, or absent/"off" (no pinning, the default: two
    kernels pinned to the same cores on one machine would share them)."""
    bind = (config.plugin_config.get("runner") or {}).get("cpu_bind", "off")
    if bind in (None, "off", False):
        return []
    allowed = sorted(os.sched_getaffinity(0))
    n = config.threads or torch.get_num_threads()
    if bind == "auto":
        return allowed[:n]
    cpus = [int(c) for c in (bind.split(",") if isinstance(bind, str) else bind)]
    if len(cpus) != n or not set(cpus) <= set(allowed):
        raise ConfigError(f"cpu_bind {bind!r}: give {n} CPU ids (one per thread) among {allowed}")
    return cpus

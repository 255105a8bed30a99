"""A tiny GGUF checkpoint written in code, the way llama.cpp's converter writes one.

The weights come from a small random `LlamaForCausalLM`, so a test can check an import against
the model the file was made from, not only against transformers' own GGUF loader. The q/k
projections are permuted as llama.cpp permutes them (transformers' loader undoes it), the
tokenizer is a byte-level BPE ("gpt2") with a few merges, the ChatML special tokens as control
tokens, and a chat template. No download anywhere.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tidal.models import CHATML_TEMPLATE

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
CONTROL, NORMAL = 3, 1


def tokens() -> list[str]:
    """Special tokens, then the 256 byte characters, then one token per merge."""
    alphabet = list(bytes_to_unicode().values())
    return [*SPECIAL, *alphabet, *("".join(merge.split(" ")) for merge in MERGES)]


def tiny_llama(seed: int = 0, layers: int = 2, tied: bool = True) -> LlamaForCausalLM:
    """A random 4-head Llama over the vocabulary of `tokens()` (GQA: 2 kv heads)."""
    config = LlamaConfig(
        vocab_size=len(tokens()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Random norms, so a loader that dropped them (all ones) would show in the logits.
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return model.eval()


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout for q/k rows (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def write_tiny_gguf(path: Path, model: LlamaForCausalLM, dtype: str = "f32", chat_template: bool = True) -> Path:
    """Write `model` (from `tiny_llama`) to `path` as a GGUF with F32 or F16 tensors."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-test")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)

    vocabulary = tokens()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(vocabulary)
    writer.add_token_types([CONTROL if token in SPECIAL else NORMAL for token in vocabulary])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(CHATML_TEMPLATE)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if config.tie_word_embeddings and hf_name == "lm_head.weight":
            continue
        base, suffix = hf_name.rsplit(".", 1)
        name = f"{names.get_name(base)}.{suffix}"
        weights = tensor.detach().float().numpy()
        if name.endswith("attn_q.weight"):
            weights = _permute(weights, config.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            weights = _permute(weights, config.num_key_value_heads)
        # llama.cpp keeps 1-D tensors (norms) in F32 whatever the file type.
        if dtype == "f16" and weights.ndim > 1:
            weights = weights.astype(np.float16)
        writer.add_tensor(name, np.ascontiguousarray(weights))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def build_wheel(folder: Path, package: str, version: str, files: dict[str, Path]) -> Path:
    """A minimal pure-Python wheel of `package` holding `files` (path inside the wheel -> file),
    enough for `pip download --no-index --find-links folder` to serve it."""
    import zipfile

    stem = package.replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{stem}/__init__.py", "")
        for name, path in files.items():
            archive.write(path, name)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tidal-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel

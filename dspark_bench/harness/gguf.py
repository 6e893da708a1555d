"""Write a Hugging Face Llama-family model and its byte-level BPE tokenizer as a GGUF file.

llama.cpp reads only GGUF. Its own converter (`convert_hf_to_gguf.py`) refuses a tokenizer whose
pre-tokenizer it has not seen before, which is every tokenizer trained here, so this writes the
file with the `gguf` package (llama.cpp's own writer) directly: f32 (or f16) weights, so
llama.cpp's numbers stay as close to ours as its kernels allow, and the GPT-2 pre-tokenizer,
which is what a ByteLevel pre-tokenizer with its regex is. One rule of the format matters: ggml's
rotary embedding pairs neighbouring dimensions where HF's rotates the two halves, so the query
and key rows are permuted as llama.cpp's converter does (`LlamaModel.permute`).

Files are cached by what they hold (the model's fingerprint, the tokenizer, the dtype), so a
second run converts nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from dspark_bench.errors import DsparkError
from dspark_bench.results import cache_dir

ARCHITECTURES = ("llama",)  # what this writer encodes; others need llama.cpp's converter
# q8_0: llama.cpp's 8-bit blocks (32 weights and one f16 scale), quantized by the gguf package's own
# reference code; a llama.cpp user's quantized file, for the tests that hand such files to llama.cpp.
TYPES = {"f32": (np.float32, "ALL_F32"), "f16": (np.float16, "MOSTLY_F16"), "q8_0": (np.float32, "MOSTLY_Q8_0")}


def cache_home() -> Path:
    """Where converted files live (DSPARK_GGUF_HOME, else ~/.cache/dspark-bench/gguf)."""
    return cache_dir("gguf", "DSPARK_GGUF_HOME")


def converted(fingerprint: str, dtype: str = "f32") -> Path | None:
    """The cached GGUF file of the model with this fingerprint, where one was converted."""
    found = sorted(cache_home().glob(f"{fingerprint[:16]}-*-{dtype}.gguf"))
    return found[0] if found else None


def cached_gguf(model: torch.nn.Module, tokenizer, fingerprint: str, dtype: str = "f32") -> Path:
    """The model's GGUF file, written on first use; `fingerprint` identifies its weights."""
    if dtype not in TYPES:
        raise DsparkError(f"GGUF dtype {dtype!r}: choose one of {', '.join(TYPES)}")
    vocab = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:12]
    path = cache_home() / f"{fingerprint[:16]}-{vocab}-{dtype}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        write_gguf(model, tokenizer, partial, dtype)
        partial.replace(path)  # whole or absent: an interrupted conversion leaves no file that looks done
    return path


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half layout of a query/key projection to ggml's interleaved pairs."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def tensors(model: torch.nn.Module, dtype) -> dict[str, np.ndarray]:
    """GGUF tensor name -> array, in llama.cpp's LLM_ARCH_LLAMA names."""
    config = model.config
    state = {name: value.detach().to("cpu", torch.float32).numpy() for name, value in model.state_dict().items()}
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"]}
    if not config.tie_word_embeddings:  # tied: llama.cpp reuses token_embd, as the model does
        out["output.weight"] = state["lm_head.weight"]
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for layer in range(config.num_hidden_layers):
        for hf, gg in names.items():
            weight = state[f"model.layers.{layer}.{hf}.weight"]
            if gg == "attn_q":
                weight = permute(weight, config.num_attention_heads)
            elif gg == "attn_k":
                weight = permute(weight, config.num_key_value_heads)
            out[f"blk.{layer}.{gg}.weight"] = weight
    # Norms stay f32 (llama.cpp's converter keeps 1-D tensors in f32 too).
    return {name: (w if w.ndim == 1 else w.astype(dtype)) for name, w in out.items()}


def vocabulary(tokenizer) -> tuple[list[str], list[int], list[str]]:
    """Tokens by id, their GGUF token types, and the BPE merges of a byte-level BPE tokenizer."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec["model"]
    pre = spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        raise DsparkError("GGUF export writes byte-level BPE tokenizers with the GPT-2 pattern only; this one is "
                          f"{model.get('type')} with a {pre.get('type')} pre-tokenizer: use llama.cpp's "
                          "convert_hf_to_gguf.py")
    by_id = {i: t for t, i in model["vocab"].items()}
    special = {t["id"]: t["content"] for t in spec.get("added_tokens", [])}
    by_id.update(special)
    size = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    user = {t["id"] for t in spec.get("added_tokens", []) if not t.get("special")}
    # GGUF token types: 1 normal, 3 control (special), 4 user-defined (added, not special), 5 unused
    types = [4 if i in user else 3 if i in special else 1 if i in by_id else 5 for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


def add_hyperparameters(writer, config, file_type) -> None:
    """The architecture's numbers, from the HF config; a Llama that llama.cpp's loader would read
    otherwise (other rotary embeddings, biases) is refused (before the writer opens its file: at the header)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", 10000.0),
                                                          **(getattr(config, "rope_scaling", None) or {})}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise DsparkError(f"GGUF export writes plain rotary embeddings; this model's are {kind!r}")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise DsparkError("GGUF export writes Llama models without biases; this one has them: use llama.cpp's "
                          "convert_hf_to_gguf.py")
    writer.add_name(Path(str(config.name_or_path)).name or "model")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(file_type)


def write_gguf(model: torch.nn.Module, tokenizer, path: Path, dtype: str = "f32") -> Path:
    """Write `model` (a LlamaForCausalLM) and `tokenizer` into one GGUF file at `path`."""
    import gguf  # the optional [engines] extra

    config = model.config
    if config.model_type not in ARCHITECTURES:
        raise DsparkError(f"GGUF export writes {', '.join(ARCHITECTURES)} models; this one is "
                          f"{config.model_type!r}: use llama.cpp's convert_hf_to_gguf.py")
    tokens, types, merges = vocabulary(tokenizer)
    if len(tokens) > config.vocab_size:
        raise DsparkError(f"the tokenizer has {len(tokens)} tokens, the model's embedding {config.vocab_size}")
    tokens += [f"[PAD{i}]" for i in range(len(tokens), config.vocab_size)]  # llama.cpp wants one per row
    types += [5] * (config.vocab_size - len(types))
    np_dtype, file_type = TYPES[dtype]
    writer = gguf.GGUFWriter(str(path), "llama")
    add_hyperparameters(writer, config, getattr(gguf.LlamaFileType, file_type))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # llama-vocab.cpp: LLAMA_VOCAB_PRE_TYPE_GPT2
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
    eos = eos if isinstance(eos, int) else tokenizer.eos_token_id  # the one the decoders stop at (one, checked)
    for role, token in (("bos", tokenizer.bos_token_id), ("eos", eos), ("pad", tokenizer.pad_token_id)):
        if token is not None:
            getattr(writer, f"add_{role}_token_id")(int(token))
    # Our prompts are encoded without a BOS (the tokenizer adds none): llama.cpp must not add one.
    adds_bos = tokenizer.bos_token_id is not None and tokenizer("a").input_ids[:1] == [tokenizer.bos_token_id]
    writer.add_add_bos_token(adds_bos)
    writer.add_add_eos_token(False)
    for name, weight in tensors(model, np_dtype).items():
        if dtype == "q8_0" and weight.ndim == 2 and weight.shape[1] % 32 == 0:  # whole blocks only; the rest f32
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(weight, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

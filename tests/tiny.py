"""Tiny random model pairs built in the tests (no hub, no files unless asked), and the chi-square test
their sampled tokens are held to (also by benchmarks/gpu on a device)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from scipy.stats import chisquare
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 300
TEXT = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    '{"name": "value", "items": [1, 2, 3]}\n',
    "for i in range(10):\n    print(i)\n",
]


def llama(layers: int = 2, hidden: int = 32, vocab: int = VOCAB, seed: int = 0, init: float = 0.5) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=init, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return LlamaForCausalLM(config).eval()


def gpt2(layers: int = 2, hidden: int = 32, vocab: int = VOCAB, seed: int = 0, init: float = 0.5) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=2, n_positions=512,
                        initializer_range=init, bos_token_id=0, eos_token_id=1)
    return GPT2LMHeadModel(config).eval()


def noisy_copy(model: torch.nn.Module, scale: float, seed: int = 1) -> torch.nn.Module:
    """A draft that agrees with the target often but not always: its weights plus noise."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale * param.std().clamp_min(1e-3))
    return draft.eval()


def tokenizer(vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    return fast


def save_pair(folder: Path, target: torch.nn.Module, draft: torch.nn.Module, tok=None) -> tuple[str, str]:
    """Save a pair (with a tokenizer beside each) so it loads through from_pretrained."""
    tok = tok or tokenizer(target.config.vocab_size)
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = folder / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(str(path))
    return paths[0], paths[1]

# A goodput model (acceptance curves and step costs) for tests: acceptance rises with confidence
# and drafting costs enough that the schedule both goes on and stops (batch sizes 1 and 8).
GOODPUT_MODEL = str(Path(__file__).parent / "data" / "goodput_model.json")


def policy(**fields):
    """A DecodeConfig, deciding with GOODPUT_MODEL if its schedule needs one (vllm-adaptive: its step
    costs); a depth policy, unless given one, runs its threshold and gamma_max in the shallowest
    bucket and half the threshold deeper."""
    from dspark_bench.config import DecodeConfig

    if fields.get("schedule") == "budget":  # it has no engine rule variant (and alone it is goodput)
        fields["semantics"] = "dspark"
    if fields.get("schedule") == "depth" and not fields.get("depth_policy"):
        threshold, gamma = fields.get("threshold", 0.5), fields.get("gamma_max", 5)
        fields["depth_policy"] = f"{threshold:g}/{gamma},{threshold / 2:g}/{gamma}"
    from dspark_bench import schedules

    costed = schedules.named(fields.get("schedule", "")).reads_costs
    return DecodeConfig.of(**fields, goodput_model=GOODPUT_MODEL if costed else "")


def markov_llama(transitions) -> LlamaForCausalLM:
    """A Llama whose next token depends on the current one only, with the given transition
    probabilities [vocab, vocab] (row: the current token): attention and MLP write nothing, so the
    last position's state is its token's embedding, which the LM head maps to log P[token]. A
    Markov chain as a real model, for which speculative sampling's expectations are exact sums."""
    probs = torch.as_tensor(transitions, dtype=torch.float64)
    vocab = len(probs)
    hidden = 2 * vocab  # heads of 2 dims; RoPE needs an even head size
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2, num_hidden_layers=1,
                         num_attention_heads=vocab, num_key_value_heads=vocab, max_position_embeddings=64,
                         bos_token_id=0, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
                         rms_norm_eps=1e-12)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        for norm in (model.model.norm, model.model.layers[0].input_layernorm,
                     model.model.layers[0].post_attention_layernorm):
            norm.weight.fill_(1.0)
        # Token x's embedding: sqrt(hidden) on axis x (its root mean square is 1, so the final
        # norm leaves it be); the head's column x is log P[x] / sqrt(hidden).
        model.model.embed_tokens.weight.copy_(torch.eye(vocab, hidden) * hidden ** 0.5)
        head = torch.zeros(vocab, hidden, dtype=torch.float64)
        head[:, :vocab] = probs.log().T / hidden ** 0.5
        model.lm_head.weight.copy_(head.float())
    return model


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """The chi-square test's p-value of observed `counts` against the probabilities `probs`."""
    expected = probs / probs.sum() * counts.sum()
    keep = expected >= 5  # pool rare cells so the chi-square approximation holds
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    if expected[-1] == 0:
        if observed[-1] > 0:
            return 0.0  # tokens the target can never produce (e.g. outside its top-p set)
        observed, expected = observed[:-1], expected[:-1]
    return chisquare(observed, expected).pvalue

"""A tiny tokenizer and Qwen2 model built locally, for tests and the quickstart (no model hub).

The tokenizer is byte-level with no merges: every printable ASCII character is one token
(token id = 4 + byte value), and any other text is encoded losslessly byte by byte.

It is built to be exactly what transformers' ``Qwen2Tokenizer`` rebuilds from its
``tokenizer.json``: ``AutoTokenizer`` ignores ``tokenizer_class`` in a folder whose config says
``qwen2`` (transformers 5.x lists qwen2 among the models whose declared class is distrusted) and
rebuilds a byte-level BPE with its own pre-tokenizer. A character vocabulary that is not
byte-level changes ids silently on reload; a byte-level one with no merges gives the same ids
whichever class loads it, because with no merges the pre-tokenizer's splitting cannot matter.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    MixtralForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForTokenClassification,
)

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, IM_START, IM_END)

# ChatML-like: any role, one message per block; the generation prompt opens the assistant turn.
# With `tools` (OpenAI-style schemas), a first system block lists their names only: the tiny
# tokenizer spends one token per character, so no descriptions or parameter schemas.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\ntools: ' }}"
    "{% for tool in tools %}"
    "{{ (tool['function']['name'] if tool['function'] is defined else tool['name']) }}"
    "{{ ',' if not loop.last else '' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_symbols() -> list[str]:
    """The 256 printable stand-ins the byte-level pre-tokenizer uses for bytes 0..255."""
    kept = {*range(33, 127), *range(161, 173), *range(174, 256)}
    symbols, shifted = [], 0
    for byte in range(256):
        if byte in kept:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def build_tokenizer(
    *, padding_side: str = "left", extra_special: tuple[str, ...] = ()
) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer without merges: 4 special tokens (ids 0-3) + 256 bytes (ids 4-259), then the
    ``extra_special`` tokens (ids 260, ...: a vision-language model's image markers).

    ``padding_side`` is given to the constructor because that is the only way it gets saved.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for byte, symbol in enumerate(_byte_symbols()):
        vocab[symbol] = len(SPECIAL_TOKENS) + byte
    for token in extra_special:
        vocab[token] = len(vocab)
    specials = (*SPECIAL_TOKENS, *extra_special)
    backend = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        # Never produced (every byte is in the vocabulary); set to what Qwen2Tokenizer defaults to,
        # so the special tokens read the same whichever class loads the saved folder.
        unk_token=EOS_TOKEN,
        extra_special_tokens=[IM_START, IM_END, *extra_special],
        padding_side=padding_side,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def padded_vocab_size(tokenizer: PreTrainedTokenizerFast, multiple: int = 64) -> int:
    """The tokenizer's size rounded up to a multiple of ``multiple`` (the model's embedding rows)."""
    return -(-len(tokenizer) // multiple) * multiple


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 256,
    intermediate_size: int = 768,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    tie_word_embeddings: bool = True,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    num_labels: int | None = None,
    vocab_size: int | None = None,
    num_experts: int | None = None,
    experts_per_token: int = 2,
) -> PreTrainedModel:
    """A randomly initialised Qwen2 causal LM, or a token classifier (critic / reward model)
    with a ``num_labels``-wide head when ``num_labels`` is given. Same seed, same weights;
    the global torch RNG is left untouched. ``vocab_size``: the embedding's rows, default the
    tokenizer's size padded to 64 (larger: a real model's vocabulary, for benchmarks).
    ``num_experts``: a Mixtral mixture-of-experts model instead, every layer's MLP ``num_experts``
    experts of ``intermediate_size`` each, ``experts_per_token`` of them per token."""
    shared = {
        "vocab_size": vocab_size or padded_vocab_size(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_dropout": 0.0,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        # Qwen2 has no BOS token of its own; like the released checkpoints, point it at EOS.
        "bos_token_id": tokenizer.eos_token_id,
    }
    if num_experts is None:
        config = Qwen2Config(**shared)
        classes = (Qwen2ForCausalLM, Qwen2ForTokenClassification)
    else:
        config = MixtralConfig(
            **shared,
            num_local_experts=num_experts,
            num_experts_per_tok=experts_per_token,
            sliding_window=None,
        )
        classes = (MixtralForCausalLM, MixtralForTokenClassification)
    if num_labels is not None:
        config.num_labels = num_labels
        config.classifier_dropout = 0.0
    model_class = classes[0] if num_labels is None else classes[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model = model.to(dtype)
    model.config.dtype = dtype
    return model.eval()


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: str | Path) -> Path:
    """Save the tokenizer and pin its class in ``tokenizer_config.json``."""
    path = Path(path)
    tokenizer.save_pretrained(path)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    # Newer transformers ignore this for qwen2 folders (see the module docstring); older ones and
    # other loaders use it, and without it they pick a Qwen2 tokenizer from config.json.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path


def save_tiny(
    path: str | Path, *, padding_side: str = "left", stop_at_im_end: bool = False, **model_kwargs
) -> Path:
    """Write a Hugging Face folder (safetensors, config, tokenizer, chat template) holding a tiny
    model; ``model_kwargs`` go to :func:`build_model`. Returns the folder. ``stop_at_im_end``: the
    generation config's ``eos_token_id`` is [EOS, <|im_end|>], as in Qwen's chat models, so
    generation stops at the end of an assistant turn (multi-turn tasks)."""
    path = Path(path)
    tokenizer = build_tokenizer(padding_side=padding_side)
    model = build_model(tokenizer, **model_kwargs)
    if stop_at_im_end:
        model.generation_config.eos_token_id = [
            tokenizer.eos_token_id,
            tokenizer.convert_tokens_to_ids(IM_END),
        ]
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(tokenizer, path)
    return path

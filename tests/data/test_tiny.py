import json

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2ForCausalLM,
    Qwen2ForTokenClassification,
)

from tandem.models.tiny import build_model, build_tokenizer, padded_vocab_size, save_tiny, save_tokenizer

from .data_helpers import SMALL_MODEL, char_ids

SAMPLE = "<|im_start|>user\n12+30= (7*8)-9 {x: 'y'} ~`!@#$%^&|\\?<|im_end|>\n\t tail<|endoftext|><|pad|>"
EVERY_CHAR = "".join(chr(c) for c in range(1, 700))  # ASCII, Latin-1, and multi-byte characters
# What Qwen2's pre-tokenizer splits on: runs of spaces and newlines, digits, contractions, letters vs
# punctuation, CJK, emoji (4-byte UTF-8), combining marks, zero-width and non-breaking spaces.
BROAD = [
    SAMPLE,
    EVERY_CHAR,
    "e\u0301 caf\u00e9 \u20ac  \n\n  x",
    "  leading and trailing  \r\n\r\n\t\t12345678901 it's we'll they'RE\u00a0nbsp\u200bzw ",
    "\u4e2d\u6587\u6d4b\u8bd5 \U0001f600\U0001f44d\U0001f3fd \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd x\u00b2+y\u00b2",
    "<|im_start|>assistant\n<answer>(5 - 3) * 4</answer><|im_end|>\n<|im_start|>",
]
MESSAGES = [
    {"role": "system", "content": "Be brief.  \U0001f600"},
    {"role": "user", "content": "12 +  30=\n\t\u4e2d\u6587 it's"},
    {"role": "assistant", "content": " 42 "},
    {"role": "user", "content": "and\r\nnow?"},
]


def test_token_ids_are_one_per_ascii_char_and_specials_first(tokenizer):
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1)
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [2, 3]
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert len(tokenizer) == 4 + 256
    assert tokenizer("ab 1+2=\n", add_special_tokens=False)["input_ids"] == char_ids("ab 1+2=\n")
    assert tokenizer(SAMPLE)["input_ids"][:3] == [2, *char_ids("us")]
    assert tokenizer.decode(tokenizer(EVERY_CHAR)["input_ids"]) == EVERY_CHAR
    assert tokenizer.decode(tokenizer("1+1=<|im_end|>")["input_ids"], skip_special_tokens=True) == "1+1="


def test_chat_template_renders_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2="}]
    with_prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert with_prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert without == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n"


CALCULATOR = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}


def test_chat_template_lists_tool_names_in_a_system_block(tokenizer):
    messages = [
        {"role": "user", "content": "123*456"},
        {"role": "assistant", "content": '<tool_call>{"name":"calculator"}</tool_call>'},
        {"role": "tool", "content": "56088"},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=[CALCULATOR], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\ntools: calculator<|im_end|>\n"
        "<|im_start|>user\n123*456<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name":"calculator"}</tool_call><|im_end|>\n'
        "<|im_start|>tool\n56088<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    python = {"type": "function", "function": {"name": "python"}}
    two = tokenizer.apply_chat_template(messages[:1], tools=[CALCULATOR, python], tokenize=False)
    assert (
        two == "<|im_start|>system\ntools: calculator,python<|im_end|>\n<|im_start|>user\n123*456<|im_end|>\n"
    )
    # No tools (absent, None or empty): byte for byte what the template rendered before tools existed.
    plain = "<|im_start|>user\n123*456<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True) == plain
    for tools in (None, []):
        rendered = tokenizer.apply_chat_template(
            messages[:1], tools=tools, tokenize=False, add_generation_prompt=True
        )
        assert rendered == plain
    # The system block is special tokens and one token per character, as everything else.
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[:26] == [2, *char_ids("system\ntools: calculator"), 3]


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_tokenizer_round_trips_through_saved_folder(tmp_path, padding_side):
    original = build_tokenizer(padding_side=padding_side)
    folder = save_tiny(tmp_path / "m", padding_side=padding_side, **SMALL_MODEL)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
    assert (
        json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )

    # AutoTokenizer picks a Qwen2 tokenizer class for a qwen2 folder; the plain class loads it too.
    for reloaded in (AutoTokenizer.from_pretrained(folder), PreTrainedTokenizerFast.from_pretrained(folder)):
        for text in BROAD:
            ids = original(text)["input_ids"]
            assert reloaded(text)["input_ids"] == ids, text
            assert reloaded.decode(ids) == original.decode(ids)
        for add_generation_prompt in (True, False):  # the ids a rollout and the SFT data see
            kwargs = {"add_generation_prompt": add_generation_prompt}
            text = original.apply_chat_template(MESSAGES, tokenize=False, **kwargs)
            assert reloaded.apply_chat_template(MESSAGES, tokenize=False, **kwargs) == text
            ids = original(text, add_special_tokens=False)["input_ids"]
            assert reloaded(text, add_special_tokens=False)["input_ids"] == ids
            assert reloaded.apply_chat_template(MESSAGES, tokenize=True, **kwargs)["input_ids"] == ids
        assert reloaded.padding_side == padding_side
        assert (reloaded.pad_token, reloaded.eos_token, reloaded.bos_token) == (
            "<|pad|>",
            "<|endoftext|>",
            None,
        )
        assert (reloaded.pad_token_id, reloaded.eos_token_id) == (0, 1)
        assert sorted(reloaded.all_special_ids) == [0, 1, 2, 3]
        assert reloaded.chat_template == original.chat_template
        assert len(reloaded) == len(original)


def test_autotokenizer_still_rebuilds_qwen2_folders(tmp_path):
    """The premise of tiny.py's byte-level vocabulary: for a qwen2 folder AutoTokenizer ignores
    ``tokenizer_class`` and rebuilds a Qwen2Tokenizer, whose pre-tokenizer changes the ids of a
    vocabulary that is not byte-level. Shown here on a one-token-per-character vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    chars = [chr(c) for c in range(32, 127)] + ["\n", "\u00e9"]
    core = Tokenizer(
        models.WordLevel({"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(chars)}}, "<|endoftext|>")
    )
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    per_char = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")
    folder = save_tiny(tmp_path / "m", **SMALL_MODEL)  # a qwen2 config.json ...
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    save_tokenizer(per_char, folder)  # ... and this tokenizer, its class pinned in tokenizer_config.json
    reloaded = AutoTokenizer.from_pretrained(folder)
    text = "ab c\n\u00e9  x"
    changed = reloaded(text)["input_ids"] != per_char(text)["input_ids"]
    assert type(reloaded).__name__ == "Qwen2Tokenizer" and changed, (
        "transformers changed how AutoTokenizer loads a qwen2 folder (it now gives "
        f"{type(reloaded).__name__}, ids {'changed' if changed else 'kept'}); revisit the module "
        "docstring of tandem/models/tiny.py: the byte-level workaround may no longer be needed"
    )


def test_model_shape_and_config(tokenizer):
    model = build_model(tokenizer, **SMALL_MODEL)
    assert isinstance(model, Qwen2ForCausalLM)
    assert padded_vocab_size(tokenizer) == 320  # 260 tokens rounded up to a multiple of 64
    assert model.config.vocab_size == 320 and model.get_input_embeddings().weight.shape == (320, 32)
    assert (
        model.config.pad_token_id == 0 and model.config.eos_token_id == 1 and model.config.bos_token_id == 1
    )
    assert model.config.num_key_value_heads == 2 and model.config.attention_dropout == 0.0
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    untied = build_model(tokenizer, **SMALL_MODEL, tie_word_embeddings=False)
    assert untied.lm_head.weight.data_ptr() != untied.get_input_embeddings().weight.data_ptr()
    assert not model.training


def test_same_seed_same_weights_and_global_rng_untouched(tokenizer):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_model(tokenizer, **SMALL_MODEL, seed=3)
    assert torch.equal(torch.rand(1), expected_next)
    b = build_model(tokenizer, **SMALL_MODEL, seed=3)
    c = build_model(tokenizer, **SMALL_MODEL, seed=4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_dtype(tokenizer):
    model = build_model(tokenizer, **SMALL_MODEL, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_reloaded_model_gives_identical_logits(tiny_dir, tokenizer):
    original = build_model(tokenizer, **SMALL_MODEL)
    reloaded = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert isinstance(reloaded, Qwen2ForCausalLM)
    ids = torch.tensor([tokenizer("<|im_start|>user\n12+30=<|im_end|>\n")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(original(ids).logits, reloaded(ids).logits)
    assert AutoConfig.from_pretrained(tiny_dir).vocab_size == 320


def test_value_model_head_round_trips(tmp_path, tokenizer):
    critic = build_model(tokenizer, **SMALL_MODEL, num_labels=1)
    assert isinstance(critic, Qwen2ForTokenClassification)
    assert critic.dropout.p == 0.0
    folder = save_tiny(tmp_path / "critic", **SMALL_MODEL, num_labels=1)
    reloaded = AutoModelForTokenClassification.from_pretrained(folder)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        values = critic(ids).logits
        assert values.shape == (1, 4, 1)
        assert torch.equal(values, reloaded(ids).logits)

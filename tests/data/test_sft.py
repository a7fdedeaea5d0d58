import pytest
import torch

from tandem.data import DataError, PromptDataset, SFTDataset, collate_sft
from tandem.data.synthetic import make_rows, write_task
from tandem.models.tiny import CHAT_TEMPLATE, build_tokenizer

from .data_helpers import char_ids, chat_ids, chat_row, write_jsonl

EOS = 1


def sft_row(content: str, response: str) -> dict:
    return {**chat_row(content), "response": response}


def test_loss_mask_exact_on_hand_made_example(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "s.jsonl", [sft_row("1+2=", "3"), sft_row("10+5=", "15")])
    dataset = SFTDataset(path, tokenizer, max_length=64)
    prompt = chat_ids("1+2=")  # 23 tokens ending in "<|im_start|>assistant\n"
    assert dataset[0] == {"input_ids": [*prompt, *char_ids("3"), EOS], "loss_mask": [0] * 23 + [1, 1]}
    assert dataset[1]["input_ids"] == [*chat_ids("10+5="), *char_ids("15"), EOS]
    assert dataset[1]["loss_mask"] == [0] * 24 + [1, 1, 1]
    assert dataset.report == {"total": 2, "kept": 2, "filtered": 0, "truncated": 0}


def test_prompt_tokens_match_the_rl_prompt_dataset(tmp_path, tokenizer):
    path = write_task("countdown", tmp_path / "c.parquet", 8, seed=1)
    sft = SFTDataset(path, tokenizer, max_length=256)
    prompts = PromptDataset(path, tokenizer, max_prompt_length=256)
    rows = make_rows("countdown", 8, seed=1)
    for i in range(8):
        n = len(prompts[i]["input_ids"])
        assert sft[i]["input_ids"][:n] == prompts[i]["input_ids"]
        assert sft[i]["loss_mask"] == [0] * n + [1] * (len(sft[i]["input_ids"]) - n)
        assert tokenizer.decode(sft[i]["input_ids"][n:]) == rows[i]["response"] + "<|endoftext|>"


def test_plain_template(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "s.jsonl", [sft_row("7+1=", "8")])
    item = SFTDataset(path, tokenizer, max_length=64, chat_template="plain")[0]
    assert item == {"input_ids": [*char_ids("7+1=8"), EOS], "loss_mask": [0, 0, 0, 0, 1, 1]}


def test_right_truncation_and_filter(tmp_path, tokenizer):
    rows = [sft_row("ab", "cdef"), sft_row("abcde", "f"), sft_row("a", "b")]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    dataset = SFTDataset(path, tokenizer, max_length=5, truncation="right", chat_template="plain")
    assert dataset.report == {"total": 3, "kept": 2, "filtered": 1, "truncated": 1}
    assert dataset[0] == {"input_ids": char_ids("abcde"), "loss_mask": [0, 0, 1, 1, 1]}  # EOS cut off
    assert dataset[1] == {"input_ids": [*char_ids("ab"), EOS], "loss_mask": [0, 1, 1]}
    with pytest.raises(DataError) as err:
        SFTDataset(path, tokenizer, max_length=5, chat_template="plain")
    assert f"{path} row 0 (line 1)" in str(err.value) and "7 tokens" in str(err.value)
    assert "data.max_length=5" in str(err.value)
    with pytest.raises(ValueError, match="data.truncation must be one of"):
        SFTDataset(path, tokenizer, max_length=5, truncation="left")


@pytest.mark.parametrize(
    ("bad", "phrase"),
    [
        ({"prompt": [{"role": "user", "content": "x"}]}, "missing field 'response'"),
        (sft_row("x", "y") | {"response": 3}, "field 'response' must be a str"),
        ({"response": "y"}, "missing field 'prompt'"),
        (
            sft_row("x", "y") | {"prompt": [{"content": "x"}]},
            "field 'prompt' message 0 needs a string 'role'",
        ),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, tokenizer, bad, phrase):
    path = write_jsonl(tmp_path / "s.jsonl", [sft_row("a", "b"), bad])
    with pytest.raises(DataError) as err:
        SFTDataset(path, tokenizer, max_length=64)
    assert str(err.value).startswith(f"{path} row 1 (line 2): ") and phrase in str(err.value)


def test_custom_keys(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "s.jsonl", [{"question": "q", "answer": "a"}])
    item = SFTDataset(
        path, tokenizer, max_length=8, prompt_key="question", response_key="answer", chat_template="none"
    )[0]
    assert item == {"input_ids": [*char_ids("qa"), EOS], "loss_mask": [0, 1, 1]}


def test_collate_right_pads_exactly():
    items = [
        {"input_ids": [5, 6, 7, 1], "loss_mask": [0, 0, 1, 1]},
        {"input_ids": [8, 1], "loss_mask": [0, 1]},
    ]
    batch = collate_sft(items, pad_token_id=0)
    assert len(batch) == 2
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7, 1], [8, 1, 0, 0]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]))
    assert torch.equal(batch["position_ids"], torch.tensor([[0, 1, 2, 3], [0, 1, 1, 1]]))
    assert torch.equal(batch["loss_mask"], torch.tensor([[0, 0, 1, 1], [0, 1, 0, 0]]))


# --- conversations (multi-turn SFT) ----------------------------------------------------------

IM_END = 3
CALCULATOR = [{"type": "function", "function": {"name": "calculator"}}]
CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"2*3"}}</tool_call>'
CONVERSATION = [
    {"role": "user", "content": "2*3"},
    {"role": "assistant", "content": CALL},
    {"role": "tool", "content": "6"},
    {"role": "assistant", "content": "6"},
]


def stop_ids(tokenizer) -> list[int]:
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]


def block(role: str, content: str) -> list[int]:
    """``<|im_start|>{role}\\n{content}<|im_end|>\\n``."""
    return [2, *char_ids(f"{role}\n{content}"), IM_END, *char_ids("\n")]


def test_conversation_trains_exactly_the_assistant_turns_and_their_end_token(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    dataset = SFTDataset(
        path, tokenizer, max_length=256, tools=CALCULATOR, stop_token_ids=stop_ids(tokenizer)
    )
    assert stop_ids(tokenizer) == [EOS, IM_END]
    header = [2, *char_ids("assistant\n")]
    expected = [
        (block("system", "tools: calculator"), 0),
        (block("user", "2*3"), 0),
        (header, 0),
        ([*char_ids(CALL), IM_END], 1),  # the tool call and the <|im_end|> that ends the turn
        (char_ids("\n"), 0),
        (block("tool", "6"), 0),
        (header, 0),
        ([*char_ids("6"), IM_END], 1),  # the answer and its <|im_end|>
        (char_ids("\n"), 0),
    ]
    assert dataset[0] == {
        "input_ids": [token for ids, _ in expected for token in ids],
        "loss_mask": [trained for ids, trained in expected for _ in ids],
    }
    assert sum(dataset[0]["loss_mask"]) == len(CALL) + 1 + 2
    text = tokenizer.apply_chat_template(CONVERSATION, tools=CALCULATOR, tokenize=False)
    assert dataset.sample_texts == [(f"{path} row 0 (line 1)", text)]
    assert dataset[0]["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert dataset.report == {"total": 1, "kept": 1, "filtered": 0, "truncated": 0}


def test_turn_mask_trains_each_assistant_turn_whole_as_verl_does(tmp_path, tokenizer):
    """data.sft_loss_mask=turn (verl's MultiTurnSFTDataset: each message rendered alone, the assistant's trained
    after the generation prompt): the `\\n` after <|im_end|> is trained too, on the Qwen-style template."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    item = SFTDataset(path, tokenizer, max_length=256, tools=CALCULATOR, loss_mask="turn")[0]
    header = [2, *char_ids("assistant\n")]
    expected = [
        (block("system", "tools: calculator"), 0),
        (block("user", "2*3"), 0),
        (header, 0),
        ([*char_ids(CALL), IM_END, *char_ids("\n")], 1),  # the call, <|im_end|> and the newline after it
        (block("tool", "6"), 0),
        (header, 0),
        ([*char_ids("6"), IM_END, *char_ids("\n")], 1),
    ]
    assert item == {
        "input_ids": [token for ids, _ in expected for token in ids],
        "loss_mask": [trained for ids, trained in expected for _ in ids],
    }
    stop = SFTDataset(path, tokenizer, max_length=256, tools=CALCULATOR, stop_token_ids=stop_ids(tokenizer))[
        0
    ]
    assert stop["input_ids"] == item["input_ids"]
    assert sum(item["loss_mask"]) == sum(stop["loss_mask"]) + 2 == len(CALL) + 2 + 3  # one newline per turn


def test_turn_mask_needs_no_stop_token_in_the_template(tmp_path, tokenizer):
    """A base model's folder (generation_config eos <|endoftext|> alone) with a template that ends turns with
    <|im_end|>: verl trains these rows, and so does the turn mask; the stop mask refuses naming the ways out."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}, {"messages": CONVERSATION[:2]}])
    base = SFTDataset(path, tokenizer, max_length=256, stop_token_ids=[EOS], loss_mask="turn")
    assert [sum(base[i]["loss_mask"]) for i in range(2)] == [len(CALL) + 2 + 3, len(CALL) + 2]
    with pytest.raises(DataError) as err:
        SFTDataset(path, tokenizer, max_length=256, stop_token_ids=[EOS])
    assert "data.sft_loss_mask=turn" in str(err.value) and "generation_config.json's eos_token_id" in str(
        err.value
    )
    with pytest.raises(ValueError, match="data.sft_loss_mask must be one of"):
        SFTDataset(path, tokenizer, max_length=256, loss_mask="all")


def test_conversation_prompt_is_the_rl_prompt(tmp_path, tokenizer):
    """The tokens before the first trained one are what the RL run (and the agent loop) feeds the
    model for the same prompt: with tools, render_prompt with the same tools; without, PromptDataset."""
    from tandem.data.rows import render_prompt

    path = write_task("tool_multiply", tmp_path / "t.parquet", 6, seed=0)
    prompts = PromptDataset(path, tokenizer, max_prompt_length=64)
    rows = make_rows("tool_multiply", 6, seed=0)
    for tools in (None, CALCULATOR):
        sft = SFTDataset(path, tokenizer, max_length=256, tools=tools, stop_token_ids=stop_ids(tokenizer))
        for i in range(6):
            first = sft[i]["loss_mask"].index(1)
            rendered = render_prompt(rows[i]["prompt"], tokenizer, "chat", tools=tools)
            assert sft[i]["input_ids"][:first] == tokenizer(rendered, add_special_tokens=False)["input_ids"]
            if tools is None:
                assert sft[i]["input_ids"][:first] == prompts[i]["input_ids"]
            trained = [t for t, m in zip(sft[i]["input_ids"], sft[i]["loss_mask"]) if m]
            answer = rows[i]["response"]
            call = rows[i]["messages"][1]["content"]
            assert tokenizer.decode(trained) == f"{call}<|im_end|>{answer}<|im_end|>"


def test_rows_without_messages_stay_pairs_and_messages_key_none_forces_pairs(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "m.jsonl", [sft_row("1+2=", "3"), {"messages": CONVERSATION}])
    dataset = SFTDataset(path, tokenizer, max_length=256, stop_token_ids=stop_ids(tokenizer))
    assert dataset[0] == {
        "input_ids": [*chat_ids("1+2="), *char_ids("3"), EOS],
        "loss_mask": [0] * 23 + [1, 1],
    }
    assert sum(dataset[1]["loss_mask"]) == len(CALL) + 3
    tool_rows = write_task("tool_multiply", tmp_path / "t.jsonl", 2, seed=0)
    pairs = SFTDataset(tool_rows, tokenizer, max_length=64, messages_key=None)
    answer = make_rows("tool_multiply", 1, seed=0)[0]["response"]
    assert pairs[0]["input_ids"] == [*chat_ids("910*391"), *char_ids(answer), EOS]
    # another column name; a null field is not a conversation
    renamed = write_jsonl(tmp_path / "r.jsonl", [{"chat": CONVERSATION}, {**sft_row("a", "b"), "chat": None}])
    dataset = SFTDataset(renamed, tokenizer, max_length=256, messages_key="chat", stop_token_ids=[IM_END])
    assert sum(dataset[0]["loss_mask"]) == len(CALL) + 3
    assert dataset[1]["input_ids"] == [*chat_ids("a"), *char_ids("b"), EOS]


def test_conversation_right_truncation_and_filter(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    full = SFTDataset(path, tokenizer, max_length=256, stop_token_ids=[IM_END])[0]
    assert len(full["input_ids"]) == 11 + 11 + len(CALL) + 2 + 9 + 11 + 3 == 124
    assert full["loss_mask"].index(1) == 22  # after the user block and the assistant header
    cut = SFTDataset(path, tokenizer, max_length=30, truncation="right", stop_token_ids=[IM_END])
    assert cut[0] == {"input_ids": full["input_ids"][:30], "loss_mask": [0] * 22 + [1] * 8}
    assert cut.report["truncated"] == 1
    with pytest.raises(DataError, match=r"row 0 \(line 1\): the conversation is 124 tokens, longer than"):
        SFTDataset(path, tokenizer, max_length=30, stop_token_ids=[IM_END])
    two = write_jsonl(tmp_path / "two.jsonl", [{"messages": CONVERSATION}, sft_row("a", "b")])
    kept = SFTDataset(two, tokenizer, max_length=22, truncation="right", stop_token_ids=[IM_END])
    assert kept.report == {"total": 2, "kept": 1, "filtered": 1, "truncated": 0}


def test_conversation_must_end_with_the_assistant(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}, {"messages": CONVERSATION[:3]}])
    with pytest.raises(DataError) as err:
        SFTDataset(path, tokenizer, max_length=256, stop_token_ids=stop_ids(tokenizer))
    message = str(err.value)
    assert message.startswith(f"{path} row 1 (line 2): field 'messages' must end with an assistant message")
    assert "the last one is 'tool'" in message


def test_turns_must_end_with_a_stop_token(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    # The default stop ids are [EOS]; the tiny template ends turns with <|im_end|>.
    with pytest.raises(DataError) as err:
        SFTDataset(path, tokenizer, max_length=256)
    message = str(err.value)
    assert message.startswith(
        f"{path} row 0 (line 1): field 'messages' message 1: the chat template does not end"
    )
    assert "stop token of the model ('<|endoftext|>'" in message and "data.sft_loss_mask=turn" in message
    with pytest.raises(ValueError, match="stop_token_ids: 999 is not a token id"):
        SFTDataset(path, tokenizer, max_length=256, stop_token_ids=[999])
    with pytest.raises(ValueError, match="stop_token_ids is empty"):
        SFTDataset(path, tokenizer, max_length=256, stop_token_ids=[])


def test_bad_templates_and_messages_are_errors_naming_the_row(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    counted = build_tokenizer()  # a header holding the message count: each longer prefix renders differently
    counted.chat_template = "{{ messages|length }}" + CHAT_TEMPLATE
    with pytest.raises(DataError) as err:
        SFTDataset(path, counted, max_length=256, stop_token_ids=[IM_END])
    assert str(err.value).startswith(
        f"{path} row 0 (line 1): field 'messages' message 1: the chat template is not prefix-stable"
    )

    # The generation prompt ends in half a special token that the content completes: tokenized
    # whole, the text holds <|im_end|> (one token); cut at the turn boundary, it is characters.
    split = build_tokenizer()
    split.chat_template = (
        "{% for m in messages %}"
        "{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n<|im_en' + m['content'] }}"
        "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}{% endif %}"
        "{{ '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<|im_en' }}{% endif %}"
    )
    merged = write_jsonl(
        tmp_path / "m.jsonl", [{"messages": [CONVERSATION[0], {"role": "assistant", "content": "d|>6"}]}]
    )
    with pytest.raises(
        DataError, match=r"row 0 \(line 1\): tokenizing the conversation turn by turn gives other tokens"
    ):
        SFTDataset(merged, split, max_length=256, stop_token_ids=[IM_END])

    bad = write_jsonl(tmp_path / "b.jsonl", [{"messages": [{"role": "user"}]}])
    with pytest.raises(DataError, match="field 'messages' message 0 needs a string 'content'"):
        SFTDataset(bad, build_tokenizer(), max_length=256)
    with pytest.raises(
        DataError, match="field 'messages' holds a conversation, which needs the tokenizer's chat template"
    ):
        SFTDataset(path, build_tokenizer(), max_length=256, chat_template="plain")

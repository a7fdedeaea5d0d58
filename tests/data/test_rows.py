"""Files a real user hands the datasets: wrong kinds, empty, broken, odd encodings, mixed schemas."""

import json
import logging
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tandem.data import DataError, PromptDataset, SFTDataset
from tandem.data.synthetic import write_rows

from .data_helpers import char_ids, chat_ids, chat_row, write_jsonl

GOOD = {**chat_row("1+1="), "response": "2"}  # a row both datasets accept


def load(path, tokenizer, **kwargs):
    return PromptDataset(path, tokenizer, max_prompt_length=kwargs.pop("max_prompt_length", 64), **kwargs)


def write_bytes(path, data: bytes):
    path.write_bytes(data)
    return path


def a_directory(path, *files: str):
    path.mkdir()
    for name in files:
        write_jsonl(path / name, [GOOD])
    return path


def an_empty_parquet(path):
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    return path


# Each case: (make the file(s) in tmp_path -> path, fragments the message must hold; "{path}" is filled in).
FILE_CASES = {
    "missing file": (lambda d: d / "nope.parquet", ["{path}: no such file", "check the data file paths"]),
    "csv file": (
        lambda d: write_bytes(d / "x.csv", b"prompt,data_source\nhi,addition\n"),
        ["{path}: unsupported file type '.csv'", "convert it to .parquet or .jsonl"],
    ),
    "json array file": (
        lambda d: write_bytes(d / "x.json", json.dumps([GOOD]).encode()),
        ["{path}: unsupported file type '.json'"],
    ),
    "directory of data files": (
        lambda d: a_directory(d / "data", "b.jsonl"),
        ["{path}: is a directory (data files in it: b.jsonl)", "list the data files themselves"],
    ),
    "directory named like a file": (
        lambda d: a_directory(d / "train.parquet"),
        ["{path}: is a directory (no .parquet or .jsonl files in it)"],
    ),
    "empty jsonl": (lambda d: write_bytes(d / "e.jsonl", b""), ["{path}: the file holds no rows"]),
    "jsonl of blank lines": (
        lambda d: write_bytes(d / "e.jsonl", b"\n  \n\r\n"),
        ["{path}: the file holds no rows"],
    ),
    "zero-row parquet": (lambda d: an_empty_parquet(d / "e.parquet"), ["{path}: the file holds no rows"]),
    "zero-byte parquet": (
        lambda d: write_bytes(d / "cut.parquet", b""),
        ["{path}: not a readable parquet file", "written completely"],
    ),
    "jsonl named .parquet": (
        lambda d: write_bytes(d / "rows.parquet", (json.dumps(GOOD) + "\n").encode()),
        ["{path}: not a readable parquet file"],
    ),
    "not UTF-8": (
        lambda d: write_bytes(
            d / "latin1.jsonl", (json.dumps(GOOD) + "\n").encode() + b'{"prompt": "caf\xe9"}\n'
        ),
        ["{path} row 1 (line 2): not UTF-8 text (byte 0xe9 at column 16)", "save the file as UTF-8"],
    ),
    "broken JSON line": (
        lambda d: write_bytes(d / "b.jsonl", (json.dumps(GOOD) + "\n\n" + '{"prompt": [\n').encode()),
        ["{path} row 1 (line 3): not valid JSON (", "at column 13)", "each line must be one JSON object"],
    ),
    "parquet named .jsonl": (
        lambda d: write_rows([GOOD], d / "rows.parquet").rename(d / "rows.jsonl"),
        ["{path}: this is a parquet file, not jsonl; name it .parquet"],
    ),
    "pretty-printed JSON array": (
        lambda d: write_bytes(d / "p.jsonl", json.dumps([GOOD], indent=1).encode()),
        ["{path} row 0 (line 1): not valid JSON", "looks like one JSON array: write one object per line"],
    ),
    "one-line JSON array": (
        lambda d: write_bytes(d / "a.jsonl", json.dumps([GOOD]).encode()),
        ["{path} row 0 (line 1): a row must be a JSON object", "got list", "one object per line"],
    ),
}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
@pytest.mark.parametrize("dataset", ["prompts", "sft"])
def test_bad_files_are_named_with_what_to_do(tmp_path, tokenizer, case, dataset):
    make, fragments = FILE_CASES[case]
    path = make(tmp_path)
    with pytest.raises(DataError) as err:
        if dataset == "prompts":
            load(path, tokenizer)
        else:
            SFTDataset(path, tokenizer, max_length=64)
    for fragment in fragments:
        assert fragment.format(path=path) in str(err.value)


def test_no_files_at_all(tokenizer):
    with pytest.raises(DataError, match="no data files given: pass at least one .parquet or .jsonl file"):
        load([], tokenizer)


def test_blank_lines_bom_crlf_and_upper_case_suffix_are_read(tmp_path, tokenizer):
    line = json.dumps(chat_row("a")).encode()
    path = write_bytes(tmp_path / "win.JSONL", b"\xef\xbb\xbf" + line + b"\r\n\r\n\n" + line + b"\r\n")
    dataset = load(path, tokenizer, chat_template="plain")
    assert dataset.report == {"total": 2, "kept": 2, "filtered": 0, "truncated": 0}
    assert [dataset[i]["input_ids"] for i in range(2)] == [char_ids("a")] * 2
    # after blank lines, rows and lines are counted apart: row 2 sits on line 5
    write_bytes(
        path, line + b"\n\n" + line + b"\n\n" + json.dumps({**GOOD, "data_source": 1}).encode() + b"\n"
    )
    with pytest.raises(DataError, match=r"win\.JSONL row 2 \(line 5\): field 'data_source' must be a str"):
        load(path, tokenizer)


def test_parquet_prompt_as_plain_string(tmp_path, tokenizer):
    path = write_rows([{**GOOD, "prompt": "What is 1+1?"}] * 2, tmp_path / "plain.parquet")
    with pytest.raises(DataError) as err:
        load(path, tokenizer)
    message = str(err.value)
    assert message.startswith(
        f"{path} row 0: field 'prompt' must be a list of {{'role': ..., 'content': ...}}"
    )
    assert "got a string; wrap it as [{'role': 'user', 'content': ...}]" in message
    assert "set data.chat_template=none to use text as it is" in message
    # ... which is exactly how such a file is read
    assert load(path, tokenizer, chat_template="none")[1]["input_ids"] == char_ids("What is 1+1?")


def test_mixed_schemas_across_two_files(tmp_path, tokenizer):
    verl_style = write_rows([GOOD], tmp_path / "a.parquet")
    other = write_jsonl(tmp_path / "b.jsonl", [GOOD, {"question": "1+1=", "data_source": "addition"}])
    with pytest.raises(DataError) as err:
        load([verl_style, other], tokenizer)
    assert str(err.value) == (
        f"{other} row 1 (line 2): missing field 'prompt' (fields present: data_source, question). "
        "Set data.prompt_key if the prompts are in another field."
    )
    # Files that differ only in optional fields and ground-truth types load together, values untouched.
    rows_a = [chat_row("a", ground_truth="7"), {"prompt": GOOD["prompt"], "data_source": "gsm8k"}]
    rows_b = [chat_row("b", ground_truth=7), chat_row("c", ground_truth={"target": 3, "numbers": [1, 2]})]
    rows_b[1]["extra_info"] = None
    dataset = load(
        [write_rows(rows_a, tmp_path / "c.parquet"), write_jsonl(tmp_path / "d.jsonl", rows_b)], tokenizer
    )
    assert [dataset[i]["ground_truth"] for i in range(4)] == ["7", None, 7, {"target": 3, "numbers": [1, 2]}]
    assert [dataset[i]["extra_info"] for i in range(4)] == [{"split": "train"}, {}, {"split": "train"}, {}]
    assert [dataset[i]["index"] for i in range(4)] == [0, 1, 2, 3]  # no extra_info.index: position over files


def test_ground_truth_numbers_are_kept_as_numbers(tmp_path, tokenizer):
    rows = [chat_row("a", ground_truth=7), chat_row("b", ground_truth=2.5), chat_row("c", ground_truth="007")]
    for suffix in ("jsonl", "parquet"):
        if suffix == "parquet":  # a parquet column holds one type: a float column
            rows = [chat_row("a", ground_truth=7.0), chat_row("b", ground_truth=2.5)]
        dataset = load(write_rows(rows, tmp_path / f"g.{suffix}"), tokenizer)
        truths = [dataset[i]["ground_truth"] for i in range(len(dataset))]
        assert truths == [r["reward_model"]["ground_truth"] for r in rows]
        assert [type(t) for t in truths] == [type(r["reward_model"]["ground_truth"]) for r in rows]


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_non_ascii_and_emoji_round_trip(tmp_path, tokenizer, suffix):
    content = "Ünïcødé 中文 😀 e\u0301 \u200b tab\t end"
    path = write_rows([chat_row(content), chat_row("x")], tmp_path / f"u.{suffix}")
    if suffix == "jsonl":  # written as raw UTF-8, not \\u escapes, as most tools do
        path.write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [chat_row(content), chat_row("x")])
        )
        assert "😀".encode() in path.read_bytes()
    item = load(path, tokenizer)[0]
    assert item["raw_prompt"][0]["content"] == content
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    # the tokenizer normalizes to NFC: "e" + combining accent comes back as one character
    assert tokenizer.decode(item["input_ids"]) == unicodedata.normalize("NFC", rendered)
    assert len(item["input_ids"]) > len(chat_ids("x")) + len(content)  # multi-byte characters: several ids


def test_rows_without_reward_model_or_extra_info(tmp_path, tokenizer):
    path = write_jsonl(
        tmp_path / "p.jsonl", [{"prompt": GOOD["prompt"], "data_source": "x", "extra_info": None}]
    )
    item = load(path, tokenizer)[0]
    assert (item["ground_truth"], item["extra_info"], item["index"]) == (None, {}, 0)


@pytest.mark.parametrize(
    ("bad", "fragments"),
    [
        ({**GOOD, "data_source": " "}, ["field 'data_source' is empty", "it picks the reward function"]),
        ({**GOOD, "data_source": float("nan")}, ["field 'data_source' must be a str, got float (nan)"]),
        ({**GOOD, "extra_info": [1]}, ["field 'extra_info' must be an object (dict)", "leave the field out"]),
        (
            {**GOOD, "prompt": []},
            ["field 'prompt' must be a list", "empty list; give it at least one message"],
        ),
    ],
    ids=["blank data_source", "NaN data_source", "extra_info a list", "no messages"],
)
def test_more_bad_fields(tmp_path, tokenizer, bad, fragments):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, bad])
    with pytest.raises(DataError) as err:
        load(path, tokenizer)
    assert str(err.value).startswith(f"{path} row 1 (line 2): ")
    for fragment in fragments:
        assert fragment in str(err.value)


def test_chat_template_failure_names_the_row(tmp_path):
    from tandem.models.tiny import build_tokenizer

    strict = build_tokenizer()
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    path = write_jsonl(tmp_path / "p.jsonl", [GOOD, {**GOOD, "prompt": [{"role": "system", "content": "s"}]}])
    for make in (lambda: load(path, strict), lambda: SFTDataset(path, strict, max_length=64)):
        with pytest.raises(DataError) as err:
            make()
        assert str(err.value).startswith(
            f"{path} row 1 (line 2): the tokenizer's chat template fails on field"
        )
        assert "System role not supported" in str(err.value) and "data.chat_template=plain" in str(err.value)


# --- long prompts ---------------------------------------------------------------------------------

LONG = "x" * 40 + "END"


@pytest.fixture
def long_and_short(tmp_path):
    return write_jsonl(tmp_path / "long.jsonl", [chat_row("ok"), chat_row(LONG), chat_row(LONG)])


def test_long_chat_prompt_left_keeps_the_end(long_and_short, tokenizer):
    dataset = load(long_and_short, tokenizer, max_prompt_length=30, truncation="left")
    assert dataset[1]["input_ids"] == chat_ids(LONG)[-30:]
    assert tokenizer.decode(dataset[1]["input_ids"]).endswith("xxEND<|im_end|>\n<|im_start|>assistant\n")
    assert dataset[0]["input_ids"] == chat_ids("ok")


def test_long_chat_prompt_right_keeps_the_generation_prompt(long_and_short, tokenizer):
    dataset = load(long_and_short, tokenizer, max_prompt_length=30, truncation="right")
    generation_prompt = [2, *char_ids("assistant\n")]  # <|im_start|>assistant\n: 11 tokens
    assert dataset[1]["input_ids"] == chat_ids(LONG)[:19] + generation_prompt
    assert (
        tokenizer.decode(dataset[1]["input_ids"])
        == "<|im_start|>user\n" + "x" * 13 + "<|im_start|>assistant\n"
    )
    assert dataset.report == {"total": 3, "kept": 3, "filtered": 0, "truncated": 2}
    with pytest.raises(DataError) as err:  # no room left for any of the prompt
        load(long_and_short, tokenizer, max_prompt_length=11, truncation="right")
    assert str(err.value).startswith(
        f"{long_and_short} row 0 (line 1): data.max_prompt_length=11 leaves no room"
    )
    assert "11-token generation prompt; raise data.max_prompt_length" in str(err.value)
    # plain rendering has no generation prompt: the first tokens are kept as they are
    plain = load(long_and_short, tokenizer, max_prompt_length=5, truncation="right", chat_template="plain")
    assert plain[1]["input_ids"] == char_ids("xxxxx")


def test_long_chat_prompt_error_and_filter_name_the_rows(long_and_short, tokenizer, caplog):
    with pytest.raises(DataError) as err:
        load(long_and_short, tokenizer, max_prompt_length=30)
    n = len(chat_ids(LONG))
    assert str(err.value).startswith(f"{long_and_short} row 1 (line 2): prompt is {n} tokens, longer than")
    assert "data.max_prompt_length=30; raise data.max_prompt_length or set data.truncation" in str(err.value)
    with caplog.at_level(logging.INFO, logger="tandem.data.prompts"):
        dataset = load(long_and_short, tokenizer, max_prompt_length=30, truncation="filter")
    assert len(dataset) == 1 and dataset.report["filtered"] == 2
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"prompts from 1 file(s): 3 rows, 1 kept, 2 filtered, 0 truncated (data.max_prompt_length=30, "
        f"data.truncation=filter); e.g. {long_and_short} row 1 (line 2) ({n} tokens), "
        f"{long_and_short} row 2 (line 3) ({n} tokens)"
    )


def test_nothing_changed_logs_at_info(long_and_short, tokenizer, caplog):
    with caplog.at_level(logging.INFO, logger="tandem.data.prompts"):
        load(long_and_short, tokenizer, max_prompt_length=200)
    [record] = caplog.records
    assert record.levelno == logging.INFO and "3 rows, 3 kept, 0 filtered, 0 truncated" in record.getMessage()


def test_sft_filtered_rows_are_named_in_the_log(tmp_path, tokenizer, caplog):
    rows = [{**chat_row("ab"), "response": "cd"}, {**chat_row(LONG), "response": "y"}]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    with caplog.at_level(logging.INFO, logger="tandem.data.sft"):
        dataset = SFTDataset(path, tokenizer, max_length=30, truncation="right")
    assert dataset.report == {"total": 2, "kept": 1, "filtered": 1, "truncated": 0}
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    expected = "1 filtered, 0 truncated (data.max_length=30, data.truncation=right); e.g. "
    assert f"{expected}{path} row 1 (line 2) (prompt alone" in record.getMessage()


def test_sft_response_written_as_a_number(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "s.jsonl", [GOOD, {**GOOD, "response": 42}])
    with pytest.raises(DataError) as err:
        SFTDataset(path, tokenizer, max_length=64)
    assert str(err.value) == (
        f"{path} row 1 (line 2): field 'response' must be a str, got int (42); write it as a str in every row"
    )

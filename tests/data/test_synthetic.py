import ast
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tandem.data.synthetic import DECLINE, make_rows, write_splits, write_task

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def evaluate(expression: str) -> tuple[int, list[int]]:
    """Value of an expression of integers and + - * (nothing else allowed), and the numbers it uses."""
    used: list[int] = []

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return node.value
        raise ValueError(f"not allowed in a countdown answer: {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval").body), used


def test_evaluate_rejects_anything_but_arithmetic():
    assert evaluate("3*(4-1)+2") == (11, [3, 4, 1, 2])
    for bad in ("__import__('os')", "2**3", "7/2", "x+1"):
        with pytest.raises(ValueError):
            evaluate(bad)


def test_addition_rows_are_correct():
    rows = make_rows("addition", 50, seed=1, digits=3)
    for i, row in enumerate(rows):
        content = row["prompt"][0]["content"]
        a, b = content.removesuffix("=").split("+")
        assert content.endswith("=") and len(a) <= 3 and len(b) <= 3
        assert row["reward_model"] == {"ground_truth": str(int(a) + int(b)), "style": "rule"}
        assert row["response"] == row["reward_model"]["ground_truth"]
        assert row["data_source"] == "addition"
        assert row["extra_info"] == {"index": i, "split": "train"}
        assert row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1
    assert max(int(r["response"]) for r in rows) > 100  # three digits really used


@pytest.mark.parametrize("num_numbers", [3, 4])
def test_countdown_answers_reach_target_using_each_number_once(num_numbers):
    rows = make_rows("countdown", 100, seed=7, num_numbers=num_numbers, split="val")
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        value, used = evaluate(row["response"])
        assert value == truth["target"] and 1 <= value <= 100
        assert Counter(used) == Counter(truth["numbers"]) and len(used) == num_numbers
        listed = " ".join(map(str, truth["numbers"]))
        assert row["prompt"][0]["content"] == f"Use {listed} and + - * to make {truth['target']}."
        assert row["data_source"] == "countdown" and row["extra_info"]["split"] == "val"
    assert len({r["response"] for r in rows}) > 80  # varied problems, not one repeated
    assert any("(" in r["response"] for r in rows)  # bracketed sub-expressions do occur


def test_unknown_task_and_bad_options():
    with pytest.raises(ValueError, match="unknown synthetic task 'multiply'.*addition"):
        make_rows("multiply", 3, 0)
    with pytest.raises(ValueError, match="num_numbers must be 3 or 4"):
        make_rows("countdown", 3, 0, num_numbers=5)
    with pytest.raises(TypeError):
        make_rows("addition", 3, 0, num_numbers=3)


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_same_seed_same_file(tmp_path, suffix):
    a = write_task("countdown", tmp_path / f"a.{suffix}", 20, seed=5)
    b = write_task("countdown", tmp_path / f"b.{suffix}", 20, seed=5)
    c = write_task("countdown", tmp_path / f"c.{suffix}", 20, seed=6)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_parquet_schema_and_contents_match_jsonl(tmp_path):
    pq_path = write_task("countdown", tmp_path / "cd.parquet", 10, seed=0, num_numbers=4)
    jl_path = write_task("countdown", tmp_path / "cd.jsonl", 10, seed=0, num_numbers=4)
    table = pq.read_table(pq_path)
    schema = table.schema
    assert schema.field("prompt").type == pa.list_(
        pa.struct([("role", pa.string()), ("content", pa.string())])
    )
    assert schema.field("data_source").type == pa.string()
    assert schema.field("response").type == pa.string()
    truth = pa.struct([("target", pa.int64()), ("numbers", pa.list_(pa.int64()))])
    assert schema.field("reward_model").type == pa.struct([("ground_truth", truth), ("style", pa.string())])
    assert schema.field("extra_info").type == pa.struct([("index", pa.int64()), ("split", pa.string())])
    jsonl_rows = [json.loads(line) for line in jl_path.read_text().splitlines()]
    assert table.to_pylist() == jsonl_rows == make_rows("countdown", 10, 0, num_numbers=4)

    addition = pq.read_table(write_task("addition", tmp_path / "add.parquet", 3, seed=0)).schema
    assert addition.field("reward_model").type == pa.struct(
        [("ground_truth", pa.string()), ("style", pa.string())]
    )


def test_write_splits(tmp_path):
    paths = write_splits("addition", tmp_path / "add", n_train=6, n_val=4, seed=2)
    assert {k: p.name for k, p in paths.items()} == {"train": "train.parquet", "val": "val.parquet"}
    train, val = (pq.read_table(paths[k]).to_pylist() for k in ("train", "val"))
    assert (len(train), len(val)) == (6, 4)
    assert {r["extra_info"]["split"] for r in val} == {"val"}
    assert [r["prompt"] for r in train[:4]] != [r["prompt"] for r in val]
    assert [r["extra_info"]["index"] for r in train] == list(range(6))


def test_write_splits_holds_out_validation_problems(tmp_path):
    # one-digit addition has only 100 problems: 60 validation rows take a good share of them
    paths = write_splits("addition", tmp_path / "add", n_train=200, n_val=60, seed=0, digits=1)
    train, val = (pq.read_table(paths[k]).to_pylist() for k in ("train", "val"))
    assert len(train) == 200
    val_prompts = {r["prompt"][0]["content"] for r in val}
    assert not val_prompts & {r["prompt"][0]["content"] for r in train}
    # a task that cannot leave any problem for training says so
    with pytest.raises(ValueError, match=r"n_train=5 .*n_val smaller"):
        write_splits("addition", tmp_path / "tiny", n_train=5, n_val=2000, seed=0, digits=1)
    with pytest.raises(ValueError, match=r"\.parquet or \.jsonl"):
        write_task("addition", tmp_path / "x.csv", 2, seed=0)


def test_tool_multiply_rows_for_a_fixed_seed():
    rows = make_rows("tool_multiply", 3, seed=0)
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"910*391"}}</tool_call>'
    assert rows[0] == {
        "prompt": [{"role": "user", "content": "910*391"}],
        "data_source": "tool_multiply",
        "reward_model": {"ground_truth": "355810", "style": "rule"},  # 910 * 391 by hand
        "extra_info": {"index": 0, "split": "train"},
        "response": "355810",
        "messages": [
            {"role": "user", "content": "910*391"},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": "355810"},
            {"role": "assistant", "content": "355810"},
        ],
    }
    assert [(r["prompt"][0]["content"], r["response"]) for r in rows[1:]] == [
        ("641*695", "445495"),
        ("183*802", "146766"),
    ]


def test_tool_multiply_products_of_three_digit_numbers():
    rows = make_rows("tool_multiply", 2000, seed=3, split="val")
    factors = []
    for i, row in enumerate(rows):
        a, b = map(int, row["prompt"][0]["content"].split("*"))
        factors += [a, b]
        assert row["reward_model"]["ground_truth"] == row["response"] == str(a * b)
        assert row["extra_info"] == {"index": i, "split": "val"}
        assert row["messages"][0] == row["prompt"][0]
        assert json.loads(
            row["messages"][1]["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")
        ) == {
            "name": "calculator",
            "arguments": {"expression": f"{a}*{b}"},
        }
        assert row["messages"][2:] == [
            {"role": "tool", "content": str(a * b)},
            {"role": "assistant", "content": str(a * b)},
        ]
    assert min(factors) >= 100 and max(factors) <= 999
    assert min(factors) < 110 and max(factors) > 990  # the whole range is drawn
    assert len({r["response"] for r in rows}) > 1950
    one_digit = {r["prompt"][0]["content"] for r in make_rows("tool_multiply", 500, seed=0, digits=1)}
    assert len(one_digit) == 81 and "1*1" in one_digit and "9*9" in one_digit
    with pytest.raises(ValueError, match="tool_multiply: digits must be >= 1"):
        make_rows("tool_multiply", 1, seed=0, digits=0)


def test_tool_multiply_question_words_and_a_teacher_that_declines_some_of_the_time():
    plain = make_rows("tool_multiply", 400, seed=2)
    rows = make_rows("tool_multiply", 400, seed=2, question='What is "{}"?', tool_share=0.4)
    declined = 0
    for row in rows:
        a, b = map(int, row["prompt"][0]["content"].removeprefix('What is "').removesuffix('"?').split("*"))
        assert row["reward_model"]["ground_truth"] == row["response"] == str(a * b)  # scored as before
        assert row["messages"][0] == row["prompt"][0]
        if len(row["messages"]) == 2:  # answered without the tool
            assert row["messages"][1] == {"role": "assistant", "content": DECLINE}
            declined += 1
            continue
        call = json.loads(
            row["messages"][1]["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")
        )
        assert call["arguments"] == {"expression": f"{a}*{b}"}  # the expression alone, not the question
        assert [m["content"] for m in row["messages"][2:]] == [str(a * b)] * 2
    assert 0.5 < declined / len(rows) < 0.7  # 1 - tool_share = 0.6 of them
    # tool_share=1.0 draws nothing more: the same problems, in the same order, as before the option
    assert [r["prompt"][0]["content"] for r in plain] == [
        r["prompt"][0]["content"].removeprefix('What is "').removesuffix('"?')
        for r in make_rows("tool_multiply", 400, seed=2, question='What is "{}"?')
    ]
    assert all(len(r["messages"]) == 2 for r in make_rows("tool_multiply", 20, seed=0, tool_share=0.0))
    with pytest.raises(ValueError, match=r"tool_share must be in \[0, 1\], got 1.5"):
        make_rows("tool_multiply", 1, seed=0, tool_share=1.5)


def test_tool_multiply_parquet_round_trip_and_held_out_splits(tmp_path):
    paths = write_splits("tool_multiply", tmp_path / "tm", n_train=400, n_val=30, seed=0, digits=1)
    train, val = (pq.read_table(paths[k]).to_pylist() for k in ("train", "val"))
    assert (len(train), len(val)) == (400, 30)
    val_prompts = {r["prompt"][0]["content"] for r in val}
    assert len(val_prompts) > 20  # of the 81 one-digit problems
    assert not val_prompts & {r["prompt"][0]["content"] for r in train}
    assert not val_prompts & {r["messages"][0]["content"] for r in train}
    assert val == make_rows("tool_multiply", 30, "0:val", split="val", digits=1)
    messages = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert pq.read_table(paths["train"]).schema.field("messages").type == messages
    # three digits, the default: a held-out set where one problem is under 1 %
    paths = write_splits("tool_multiply", tmp_path / "tm3", n_train=3000, n_val=500, seed=1, fmt="jsonl")
    train, val = ([json.loads(line) for line in paths[k].read_text().splitlines()] for k in ("train", "val"))
    assert (len(train), len(val)) == (3000, 500)
    assert not {r["prompt"][0]["content"] for r in val} & {r["prompt"][0]["content"] for r in train}


# ---- count_squares: the visual task ----------------------------------------------------------------------


def squares_in(image, colour_names=("red", "blue", "green")):
    """Per 28-pixel cell of a decoded count_squares image: the colour of its square, or None (a cell's square
    is the pixels far from the light background; its colour the nearest of SQUARE_COLOURS)."""
    from tandem.data.synthetic import CELL, SQUARE_COLOURS

    cells = []
    for top in range(0, image.height, CELL):
        for left in range(0, image.width, CELL):
            pixels = [
                image.getpixel((x, y)) for y in range(top, top + CELL) for x in range(left, left + CELL)
            ]
            dark = [p for p in pixels if min(p) < 200]  # the background is 225..250 in every channel
            if not dark:
                cells.append(None)
                continue
            mean = [sum(p[i] for p in dark) / len(dark) for i in range(3)]
            cells.append(
                min(colour_names, key=lambda n: sum((a - b) ** 2 for a, b in zip(mean, SQUARE_COLOURS[n])))
            )
    return cells


def test_count_squares_answers_count_the_asked_colour_in_the_drawn_image():
    import io

    from PIL import Image

    from tandem.data.synthetic import make_rows

    rows = make_rows("count_squares", 64, 0)
    answers, asked = [], set()
    for r in rows:
        (image,) = r["images"]
        decoded = Image.open(io.BytesIO(image["bytes"])).convert("RGB")
        assert decoded.size == (56, 56)  # 2 x 2 cells of 28 pixels: 4 image tokens of the tiny Qwen2-VL
        content = r["prompt"][0]["content"]
        colour = content.removeprefix("<image>How many ").removesuffix("?")
        asked.add(colour)
        assert r["reward_model"]["ground_truth"] == r["response"] == str(squares_in(decoded).count(colour))
        answers.append(int(r["response"]))
    assert asked == {"red", "blue"} and set(answers) >= {0, 1, 2}  # a spread of answers, both colours asked
    only_red = make_rows("count_squares", 8, 0, asked=["red"])
    assert all(r["prompt"][0]["content"] == "<image>How many red?" for r in only_red)
    with pytest.raises(ValueError, match="asked must name colours of"):
        make_rows("count_squares", 1, 0, asked=["purple"])


def test_count_squares_splits_hold_out_images_not_question_texts(tmp_path):
    import pyarrow.parquet as pq

    from tandem.data.synthetic import write_splits

    files = write_splits("count_squares", tmp_path, n_train=64, n_val=16, seed=3)
    train, val = (pq.read_table(files[split]).to_pylist() for split in ("train", "val"))
    assert len(train) == 64 and len(val) == 16  # two question texts only: images tell the problems apart
    held_out = {r["images"][0]["bytes"] for r in val}
    assert not any(r["images"][0]["bytes"] in held_out for r in train)

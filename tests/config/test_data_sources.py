"""The rows' data_source values against the reward scorers, checked from the config (config/checks/data_sources.py):
at `tandem config`, and by the RL trainer before it reads the data."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tandem.cli import main
from tandem.config import ConfigError, load_config
from tandem.config.checks.data_sources import check_data_sources, data_source_report


def _parquet(path, sources, styles=None):
    columns = {"data_source": sources, "prompt": ["q"] * len(sources)}
    if styles is not None:
        columns["extra_info"] = [{"style": s, "index": i} for i, s in enumerate(styles)]
    pq.write_table(pa.table(columns), path)
    return str(path)


def _cfg(train, val=None, *more):
    files = [f"data.train_files=[{train}]"] + ([f"data.val_files=[{val}]"] if val else [])
    return load_config(None, [*files, *more])


def test_several_unknown_sources_and_a_mix_each_named_with_file_and_rows(tmp_path):
    train = _parquet(
        tmp_path / "train.parquet", ["openai/gsm8k"] * 3 + ["hiyouga/geometry3kk"] * 2 + ["my_task"]
    )
    val = _parquet(tmp_path / "val.parquet", ["gsm8k", "my_task", "my_task"])
    with pytest.raises(ConfigError) as info:
        check_data_sources(_cfg(train, val))
    assert info.value.problems == [
        f"data.train_files: {train}: 2 of 6 rows have data_source 'hiyouga/geometry3kk', which no reward scorer "
        "covers (did you mean 'hiyouga/geometry3k'?) (first: train.parquet row 3)",
        f"data.train_files: {train}: 1 of 6 rows have data_source 'my_task', which no reward scorer covers "
        "(first: train.parquet row 5)",
        f"data.val_files: {val}: 2 of 3 rows have data_source 'my_task', which no reward scorer covers "
        "(first: val.parquet row 1)",
        info.value.problems[-1],
    ]
    fix = info.value.problems[-1]
    assert "gsm8k, hiyouga/geometry3k," in fix and "openai/gsm8k" in fix  # the built-in names, listed
    assert "reward.custom_reward_file=path/to/file.py reward.custom_reward_function=compute_score" in fix


def test_known_sources_a_scorer_named_by_style_and_a_custom_function_pass(tmp_path):
    train = _parquet(tmp_path / "t.parquet", ["openai/gsm8k", "addition", "my_math"], [None, None, "math"])
    assert check_data_sources(_cfg(train)) == []
    unknown = _parquet(tmp_path / "u.parquet", ["my_task"])
    scorer = tmp_path / "score.py"
    scorer.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    assert check_data_sources(_cfg(unknown, None, f"reward.custom_reward_file={scorer}")) == []


def test_with_a_reward_model_a_source_without_a_rule_scorer_is_scored_by_the_model(tmp_path):
    train = _parquet(tmp_path / "t.parquet", ["hh_rlhf", "openai/gsm8k"])
    model = ["reward.reward_model.enable=true", f"reward.reward_model.model_path={tmp_path}"]
    assert check_data_sources(_cfg(train, None, *model)) == []
    assert data_source_report(_cfg(train)).problems  # without the model: refused, as above


def test_a_style_that_names_no_scorer_is_named_with_the_source(tmp_path):
    train = _parquet(tmp_path / "t.parquet", ["my_task", "my_task"], ["poetry", "math"])
    (problem, _fix) = data_source_report(_cfg(train)).problems
    assert problem == (
        f"data.train_files: {train}: 1 of 2 rows have data_source 'my_task' and extra_info.style 'poetry', which "
        "no reward scorer covers (first: t.parquet row 0)"
    )


def test_missing_column_null_values_and_jsonl_rows(tmp_path):
    no_column = tmp_path / "n.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"]}), no_column)
    nulls = _parquet(tmp_path / "nulls.parquet", ["gsm8k", None])
    lines = tmp_path / "rows.jsonl"
    rows = [
        {"data_source": "gsm8k"},
        {"prompt": "x"},
        {"data_source": "my_task", "extra_info": {"style": None}},
    ]
    lines.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    report = data_source_report(load_config(None, [f"data.train_files=[{no_column},{nulls},{lines}]"]))
    assert report.problems[:4] == [
        f"data.train_files: {no_column}: 2 of 2 rows have no data_source field; every row needs one: the task's "
        "name, which picks its reward scorer (first: n.parquet row 0)",
        f"data.train_files: {nulls}: 1 of 2 rows have data_source None; every row needs one: the task's name, "
        "which picks its reward scorer (first: nulls.parquet row 1)",
        f"data.train_files: {lines}: 1 of 3 rows have no data_source field; every row needs one: the task's "
        "name, which picks its reward scorer (first: rows.jsonl row 1)",
        f"data.train_files: {lines}: 1 of 3 rows have data_source 'my_task', which no reward scorer covers "
        "(first: rows.jsonl row 2)",
    ]
    assert len(report.problems) == 5 and report.unchecked == []


def test_files_absent_or_unreadable_are_not_checked_and_say_so(tmp_path):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    report = data_source_report(load_config(None, [f"data.train_files=[{tmp_path}/absent.parquet,{broken}]"]))
    assert report.problems == []
    assert report.unchecked[0] == f"data.train_files: {tmp_path}/absent.parquet: not there (yet)"
    assert report.unchecked[1].startswith(f"data.train_files: {broken}: not a readable parquet file (")


def test_tandem_config_refuses_a_source_without_scorer_and_notes_absent_files(tmp_path, capsys):
    train = _parquet(tmp_path / "geo.parquet", ["geo"] * 4)
    assert main(["config", f"data.train_files=[{train}]"]) == 2
    err = capsys.readouterr().err
    assert "tandem config: config error" in err
    assert (
        f"data.train_files: {train}: 4 of 4 rows have data_source 'geo', which no reward scorer covers" in err
    )
    assert main(["config", f"data.train_files=[{tmp_path}/later.parquet]"]) == 0
    out = capsys.readouterr()
    assert f"data_source not checked, data.train_files: {tmp_path}/later.parquet: not there (yet)" in out.err
    assert "train_files:" in out.out


def test_the_rl_trainer_refuses_before_reading_models_or_data(tmp_path):
    # no model folder at all: the data_source problem comes first, before any folder, tokenizer or worker
    from tandem.trainer import RLTrainer

    train = _parquet(tmp_path / "geo.parquet", ["geo"])
    cfg = load_config(None, [f"data.train_files=[{train}]", f"actor.model_path={tmp_path}/no_model"])
    with pytest.raises(ConfigError, match="1 of 1 rows have data_source 'geo'"):
        RLTrainer(cfg)

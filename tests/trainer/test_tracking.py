import datetime
import io
import math
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tandem.trainer import tracking
from tandem.trainer.tracking import Tracker, read_jsonl

CLOCK = re.compile(r"^\d\d:\d\d:\d\d ", re.MULTILINE)


def unclocked(text: str) -> str:
    """Console text without the wall-clock time that starts every line (checked once, below)."""
    return CLOCK.sub("", text)


def rows(path: Path) -> list[dict]:
    """metrics.jsonl rows without their "time" field, which every row must carry (ISO 8601, local offset)."""
    found = read_jsonl(path)
    for row in found:
        when = datetime.datetime.fromisoformat(row.pop("time"))
        assert (
            when.tzinfo is not None and abs(datetime.datetime.now().astimezone() - when).total_seconds() < 600
        )
    return found


def tracker(tmp_path: Path, loggers: list[str], **kwargs) -> Tracker:
    kwargs.setdefault("progress", False)
    return Tracker(loggers, log_dir=tmp_path / "run", project="proj", experiment="exp", **kwargs)


# ---- jsonl -------------------------------------------------------------------------------------------


def test_jsonl_values_read_back_equal(tmp_path):
    with tracker(tmp_path, ["jsonl"]) as t:
        t.log({"score/mean": 0.25, "perf/samples": 64, "np": np.float32(1.5), "tensor": torch.tensor(2.0)}, 1)
        t.log({"score/mean": 0.5, "note": "not a number", "vector": torch.ones(3)}, 2)
    assert rows(tmp_path / "run" / "metrics.jsonl") == [
        {"step": 1, "score/mean": 0.25, "perf/samples": 64, "np": 1.5, "tensor": 2.0},
        {"step": 2, "score/mean": 0.5},
    ]


def test_jsonl_writes_non_finite_as_null(tmp_path):
    with tracker(tmp_path, ["jsonl"]) as t:
        t.log({"loss": math.nan, "up": math.inf, "down": -math.inf, "ok": 1.0}, 1)
    text = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert re.fullmatch(
        r'\{"step": 1, "time": "[^"]+", "loss": null, "up": null, "down": null, "ok": 1.0\}\n', text
    )


def test_jsonl_resume_drops_the_steps_after_start_step(tmp_path):
    with tracker(tmp_path, ["jsonl"]) as t:
        for step in range(5):
            t.log({"x": float(step)}, step)
    path = tmp_path / "run" / "metrics.jsonl"
    with path.open("a") as file:
        file.write('{"step": 5, "x": ')  # torn by a killed process
    with tracker(tmp_path, ["jsonl"], start_step=2) as t:
        t.log({"x": 30.0}, 3)
    assert rows(path) == [{"step": s, "x": x} for s, x in [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]]
    assert not path.with_name("metrics.jsonl.tmp").exists()


def test_jsonl_fresh_run_overwrites(tmp_path):
    with tracker(tmp_path, ["jsonl"]) as t:
        t.log({"x": 1.0}, 1)
        t.log({"x": 2.0}, 2)
    with tracker(tmp_path, ["jsonl"]) as t:
        t.log({"x": 9.0}, 1)
    assert rows(tmp_path / "run" / "metrics.jsonl") == [{"step": 1, "x": 9.0}]


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match="metrics.jsonl line 2 is not JSON"):
        read_jsonl(path)


# ---- console and progress ----------------------------------------------------------------------------


def test_console_line_shows_the_chosen_keys(tmp_path, capsys):
    with tracker(tmp_path, ["console"], total_steps=40, console_keys=["b", "a", "missing"]) as t:
        t.log({"a": 0.123456, "b": 3, "c": 7.0}, 3)
        t.log({"a": 12345.678}, 4)
    out = capsys.readouterr()
    assert re.match(r"\d\d:\d\d:\d\d \[step 3/40\]", out.out)  # each line starts with the time of day
    assert unclocked(out.out) == "[step 3/40] b=3 a=0.1235\n[step 4/40] a=1.235e+04\n"
    assert out.err == ""


def test_console_default_keys(tmp_path, capsys):
    with tracker(tmp_path, ["console"]) as t:
        t.log({"timing_s/step": 1.5, "val/acc": 0.75, "score/mean": 0.5, "critic/vf_loss": 2.0, "x": 3.0}, 1)
    # in DEFAULT_CONSOLE_KEYS order; "x" is not a headline metric, absent ones are skipped
    assert (
        unclocked(capsys.readouterr().out)
        == "[step 1] score/mean=0.5 val/acc=0.75 critic/vf_loss=2 timing_s/step=1.5\n"
    )


def test_without_a_terminal_the_line_carries_the_eta(tmp_path, capsys):
    with tracker(tmp_path, ["console"], total_steps=4, progress=True, console_keys=["a"]) as t:
        t.log({"a": 1.0}, 1)
        t.log({"a": 2.0}, 2)
    out = capsys.readouterr()
    lines = unclocked(out.out).splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"\[step 2/4\] a=2 \[50% \d\d:\d\d<(\d\d:\d\d|\?)\]", lines[1])
    assert out.err == ""  # no bar redraws in a log file


def test_without_console_a_status_line_goes_to_stderr_now_and_then(tmp_path, capsys):
    with tracker(tmp_path, ["jsonl"], total_steps=6, start_step=2, progress=True) as t:
        for step in (3, 4, 5, 6):
            t.log({"a": 1.0}, step)
    out = capsys.readouterr()
    assert out.out == ""
    # the first and the last step; the ones between come at most every 10 s (this test is faster)
    lines = unclocked(out.err).splitlines()
    assert [line.split("]")[0] for line in lines] == ["[step 3/6", "[step 6/6"]
    assert re.fullmatch(r"\[step 3/6\] \[50% \d\d:\d\d<(\d\d:\d\d|\?)\]", lines[0])


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_bar_counts_from_start_step(tmp_path, monkeypatch, capsys):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with tracker(tmp_path, ["console"], total_steps=10, start_step=4, progress=True, console_keys=["a"]) as t:
        assert t._bar is not None and t._bar.n == 4
        t.log({"a": 1.0}, 5)
        t.log({"a": 2.0}, 6)
        assert t._bar.n == 6
    assert (
        unclocked(capsys.readouterr().out) == "[step 5/10] a=1\n[step 6/10] a=2\n"
    )  # no ETA: the bar shows it
    assert "6/10" in terminal.getvalue()


# ---- tensorboard -------------------------------------------------------------------------------------


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_scalars(tmp_path):
    with tracker(tmp_path, ["tensorboard"]) as t:
        t.log({"actor/pg_loss": 1.5, "val/acc": 0.25, "note": "text"}, 1)
        t.log({"actor/pg_loss": 2.5, "val/acc": math.nan}, 2)
    assert scalars(tmp_path / "run" / "tensorboard") == {
        "actor/pg_loss": [(1, 1.5), (2, 2.5)],
        "val/acc": [(1, 0.25)],
    }


def test_tensorboard_resume_hides_the_rewritten_steps(tmp_path):
    with tracker(tmp_path, ["tensorboard"]) as t:
        for step in (1, 2, 3):
            t.log({"x": float(step)}, step)
    with tracker(tmp_path, ["tensorboard"], start_step=2) as t:
        t.log({"x": 30.0}, 3)
    assert scalars(tmp_path / "run" / "tensorboard") == {"x": [(1, 1.0), (2, 2.0), (3, 30.0)]}


# ---- wandb and mlflow --------------------------------------------------------------------------------


def wandb_history(log_dir: Path) -> list[dict[str, object]]:
    """The history rows of the offline run under log_dir/wandb: its .wandb file is a LevelDB-style log
    (7-byte file header, then records of crc32 / length / type in 32 KiB blocks) of protobuf Records."""
    import json

    from wandb.proto.wandb_internal_pb2 import Record

    (path,) = (log_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, block, pos, pending, rows = path.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a record header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or LAST of a split record
            record = Record.FromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {
                    "/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item
                }
                rows.append(
                    {k: v for k, v in items.items() if not k.startswith("_")} | {"step": items["_step"]}
                )
    return rows


def test_wandb_offline_run(tmp_path, monkeypatch):
    import wandb

    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with tracker(tmp_path, ["wandb"], config={"trainer": {"seed": 1}}) as t:
        t.log({"actor/pg_loss": 1.5, "val/acc": 0.25, "note": "text"}, 1)
        t.log({"actor/pg_loss": 2.5}, 2)
    wandb.teardown()  # finish() returns before the wandb service has written the run file; this waits for it
    assert wandb_history(tmp_path / "run") == [
        {"actor/pg_loss": 1.5, "val/acc": 0.25, "step": 1},
        {"actor/pg_loss": 2.5, "step": 2},
    ]


def test_mlflow_file_store_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # recorded, so the tracker's setdefault is undone
    config = {"trainer": {"seed": 1}, "data": {"train_files": ["a" * 7000]}}
    with tracker(tmp_path, ["mlflow"], config=config) as t:
        t.log({"actor/pg_loss": 1.5, "val/acc": 0.25, "note": "text"}, 1)
        t.log({"actor/pg_loss": 2.5}, 2)
    with pytest.raises(KeyError), tracker(tmp_path, ["mlflow"]):
        raise KeyError("a failing step")

    client = MlflowClient((tmp_path / "run" / "mlruns").as_uri())
    experiment_id = client.get_experiment_by_name("proj").experiment_id
    runs = {run.info.status: run for run in client.search_runs([experiment_id])}
    assert sorted(runs) == ["FAILED", "FINISHED"]
    finished = runs["FINISHED"]
    assert finished.info.run_name == "exp"
    history = client.get_metric_history(finished.info.run_id, "actor/pg_loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.5), (2, 2.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(finished.info.run_id, "val/acc")] == [
        (1, 0.25)
    ]
    assert finished.data.params["trainer.seed"] == "1"
    assert len(finished.data.params["data.train_files"]) == MAX_PARAM_VAL_LENGTH
    assert tracking._MLFLOW_MAX_PARAM_CHARS == MAX_PARAM_VAL_LENGTH


@pytest.mark.parametrize("name", ["wandb", "mlflow", "tensorboard"])
def test_missing_package_names_the_key_and_the_install(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # find_spec and import now see it as not installed
    with pytest.raises(RuntimeError, match=rf"trainer.loggers has '{name}'.*`pip install {name}`"):
        tracker(tmp_path, ["jsonl", name])
    assert not (tmp_path / "run").exists()  # checked before anything is written


def test_unknown_logger_names_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.loggers has unknown \['csv'\]; choose from"):
        tracker(tmp_path, ["console", "csv"])


def test_close_twice(tmp_path):
    t = tracker(tmp_path, ["jsonl", "tensorboard"], total_steps=2)
    t.log({"x": 1.0}, 1)
    t.close()
    t.close()
    assert rows(tmp_path / "run" / "metrics.jsonl") == [{"step": 1, "x": 1.0}]


# ---- validation generations (trainer.log_val_generations) ---------------------------------------------

GENERATIONS = [
    {
        "sample": 0,
        "data_source": "calc",
        "input": "1+2=",
        "output": "3",
        "gts": "3",
        "score": 1.0,
        "acc": 1.0,
    },
    {
        "sample": 4,
        "data_source": "calc",
        "input": "2+2=",
        "output": "5\nno",
        "gts": "4",
        "score": 0.0,
        "acc": 0.0,
    },
]


def test_generations_go_to_every_tracker_that_takes_text(tmp_path, monkeypatch):
    import json

    import wandb
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with tracker(tmp_path, ["jsonl", "tensorboard", "wandb", "mlflow"]) as t:
        for step in (0, 10):
            t.log({"val/acc": 0.5}, step)
            t.log_generations(GENERATIONS, step)
    wandb.teardown()
    run = tmp_path / "run"

    lines = read_jsonl(run / "val_generations.jsonl")
    assert [(r["step"], r["sample"], r["output"]) for r in lines] == [
        (0, 0, "3"),
        (0, 4, "5\nno"),
        (10, 0, "3"),
        (10, 4, "5\nno"),
    ]
    assert lines[1] == {**GENERATIONS[1], "step": 0}

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("val/generations/text_summary")
    assert [e.step for e in texts] == [0, 10]
    markdown = texts[0].tensor_proto.string_val[0].decode()
    assert "sample 4 · calc · score 0.0" in markdown and "    5\n    no" in markdown

    (table_file,) = run.glob("wandb/offline-run-*/files/media/table/val/generations_10_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["step", "sample", "data_source", "input", "output", "gts", "score"]
    assert [row[:2] + row[5:] for row in table["data"]] == [
        [0, 0, "3", 1.0],
        [0, 4, "4", 0.0],
        [10, 0, "3", 1.0],
        [10, 4, "4", 0.0],
    ]

    client = MlflowClient((run / "mlruns").as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    artifacts = [a.path for a in client.list_artifacts(found.info.run_id, "val_generations")]
    assert artifacts == ["val_generations/step_000000.json", "val_generations/step_000010.json"]
    local = client.download_artifacts(found.info.run_id, "val_generations/step_000010.json", str(tmp_path))
    assert json.loads(Path(local).read_text()) == {"step": 10, "samples": GENERATIONS}


def test_generations_jsonl_resume_drops_the_steps_after_start_step(tmp_path):
    with tracker(tmp_path, ["jsonl"]) as t:
        for step in (0, 5, 10):
            t.log_generations(GENERATIONS[:1], step)
    with tracker(tmp_path, ["jsonl"], start_step=5) as t:
        t.log_generations(GENERATIONS[1:], 10)
    lines = read_jsonl(tmp_path / "run" / "val_generations.jsonl")
    assert [(r["step"], r["sample"]) for r in lines] == [(0, 0), (5, 0), (10, 4)]
    with tracker(tmp_path, ["jsonl"]):  # a fresh run starts a fresh file
        pass
    assert not (tmp_path / "run" / "val_generations.jsonl").exists()


def test_a_tracker_that_fails_on_generations_is_a_warning(tmp_path, caplog):
    with tracker(tmp_path, ["jsonl"]) as t:
        (tmp_path / "run" / "val_generations.jsonl").mkdir()  # a folder where the file should be
        t.log_generations(GENERATIONS, 3)
    assert "jsonl could not log the validation generations of step 3" in caplog.text

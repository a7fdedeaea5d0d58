import math

import pytest
from matplotlib.image import imread

from tandem.commands.plot import plot_run
from tandem.trainer.tracking import Tracker

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def metrics_jsonl(tmp_path):
    with Tracker(["jsonl"], log_dir=tmp_path / "grpo", project="p", experiment="grpo", progress=False) as t:
        t.log({"val/acc": 0.25}, 0)
        t.log({"score/mean": 0.5, "actor/pg_loss": 0.1}, 1)
        t.log({"score/mean": 0.75, "val/acc": 0.5}, 2)
        t.log({"score/mean": math.nan}, 3)  # null in the file: no point
        t.log({"score/mean": 1.0, "val/acc": 0.875}, 4)
    return tmp_path / "grpo" / "metrics.jsonl"


def assert_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width = imread(path).shape[:2]
    assert height > 0 and width > 0


def test_plot_run_returns_the_plotted_series(metrics_jsonl, tmp_path):
    out = tmp_path / "plots" / "run.png"
    series = plot_run(metrics_jsonl, out, title="a run")
    assert series == {
        "reward": [(1, 0.5), (2, 0.75), (4, 1.0)],
        "accuracy": [(0, 0.25), (2, 0.5), (4, 0.875)],
    }
    assert_png(out)


def test_plot_run_other_keys_and_a_missing_one(metrics_jsonl, tmp_path):
    out = tmp_path / "run.png"
    series = plot_run(metrics_jsonl, out, reward_key="actor/pg_loss", acc_key="val/missing")
    assert series == {"reward": [(1, 0.1)], "accuracy": []}
    assert_png(out)

import pytest

from tandem.rewards import (
    DATA_SOURCES,
    SCORERS,
    UnknownDataSourceError,
    default_scorer_for,
    gsm8k_score,
    load_function,
    math_dapo_score,
    math_score,
    register_scorer,
)
from tandem.rewards.custom import split_file_spec
from tandem.rewards.scoring import Task, score_tasks, to_outcome


@pytest.fixture
def clean_registry():
    scorers, sources = dict(SCORERS), dict(DATA_SOURCES)
    yield
    SCORERS.clear()
    SCORERS.update(scorers)
    DATA_SOURCES.clear()
    DATA_SOURCES.update(sources)


def test_builtin_data_sources():
    assert default_scorer_for("openai/gsm8k") is gsm8k_score
    assert default_scorer_for("gsm8k") is gsm8k_score
    for source in ("lighteval/MATH", "HuggingFaceH4/MATH-500"):
        assert default_scorer_for(source) is math_score
    assert (
        default_scorer_for("math") is math_dapo_score
    )  # as verl routes it; the scorer *named* math is \boxed{}
    assert default_scorer_for("math_dapo") is math_dapo_score  # verl's "Answer:" rule, not \boxed{}
    assert default_scorer_for("my_olympiad", style="math") is math_score


def test_unknown_data_source_names_it_and_the_fixes():
    with pytest.raises(UnknownDataSourceError) as info:
        default_scorer_for("gsm8kk")
    message = str(info.value)
    assert "'gsm8kk'" in message
    assert "Did you mean 'gsm8k'" in message
    assert "scorer_overrides" in message and "custom_reward_file" in message and "register_scorer" in message


def test_register_scorer(clean_registry):
    @register_scorer("exact", "my/source")
    def exact(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str == ground_truth)

    assert default_scorer_for("exact") is exact
    assert default_scorer_for("my/source") is exact
    with pytest.raises(ValueError, match="already registered"):
        register_scorer("exact")(lambda *a: 0.0)
    with pytest.raises(ValueError, match="already scored"):
        register_scorer("other", "openai/gsm8k")(lambda *a: 0.0)
    with pytest.raises(ValueError, match="already a data_source"):
        register_scorer("my/source")(lambda *a: 0.0)


def test_load_function_from_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def compute_score(ds, s, gt, info=None):\n    return 0.25\n\ndef other(*a):\n    return 1\n"
    )
    assert load_function(path)("x", "y", "z", None) == 0.25
    assert load_function(str(path), "other")() == 1
    with pytest.raises(AttributeError) as info:
        load_function(path, "missing_fn")
    assert (
        "missing_fn" in str(info.value)
        and str(path) in str(info.value)
        and "compute_score" in str(info.value)
    )
    with pytest.raises(FileNotFoundError) as info:
        load_function(tmp_path / "nope.py", "compute_score")
    assert "nope.py" in str(info.value) and "compute_score" in str(info.value)


def test_split_file_spec():
    assert split_file_spec("dir/r.py:score_fn") == ("dir/r.py", "score_fn")
    assert split_file_spec("dir/r.py") == ("dir/r.py", "compute_score")
    assert split_file_spec("gsm8k") is None


def test_outcomes_from_scorer_returns():
    assert to_outcome(1) == (1.0, {}, None, False)
    assert to_outcome(True).score == 1.0
    assert to_outcome({"score": 0.5, "acc": True, "obj": [1]}).fields == {"acc": True, "obj": "[1]"}
    for bad, match in (
        ({"acc": 1}, "'score'"),
        ("1.0", "number"),
        (None, "number"),
        (float("nan"), "non-finite"),
    ):
        with pytest.raises((TypeError, ValueError), match=match):
            to_outcome(bad)


def test_score_tasks_turns_exceptions_into_errors():
    def broken(ds, s, gt, info):
        raise KeyError("no such field")

    specs = {"ok": lambda ds, s, gt, info: 0.5, "broken": broken, "missing": ("/nonexistent/file.py", "f")}
    tasks = [Task(key, "src", "text", "gt", None) for key in ("ok", "broken", "missing")]
    ok, failed, missing = score_tasks(tasks, specs, {})
    assert ok == (0.5, {}, None, False)
    assert failed.score == 0.0 and failed.error.startswith("KeyError: 'no such field' (at test_registry.py:")
    assert missing.error.startswith("cannot load the scorer: FileNotFoundError")


@pytest.mark.parametrize(
    ("source", "fragments"),
    [
        (
            "def compute_score(ds, s, gt, info=None):\n    return 1 +\n",
            ["running the file failed: SyntaxError: invalid syntax at line 2: `return 1 +`"],
        ),
        (
            "import os\nimport not_a_module_anyone_has\n",
            [
                "running the file failed: ModuleNotFoundError: No module named 'not_a_module_anyone_has' (line 2)"
            ],
        ),
        ("x = 1\nraise SystemExit(3)\n", ["running the file failed: SystemExit: 3 (line 2)"]),
    ],
)
def test_custom_file_that_fails_to_load_is_named(tmp_path, source, fragments):
    path = tmp_path / "broken_reward.py"
    path.write_text(source)
    with pytest.raises(ImportError) as info:
        load_function(path)
    message = str(info.value)
    assert message.startswith(
        f"custom reward function 'compute_score' in file '{path}': running the file failed"
    )
    assert message.endswith("; fix it, or run the file with python to see the full error")
    for fragment in fragments:
        assert fragment in message
    path.write_text(
        "def compute_score(*a):\n    return 1.0\n"
    )  # fixed: loads now, nothing cached from before
    assert load_function(path)() == 1.0


def test_custom_file_path_is_a_directory(tmp_path):
    with pytest.raises(
        IsADirectoryError, match="that is a directory; point custom_reward_file at the .py file"
    ):
        load_function(tmp_path)

import gc
import multiprocessing as mp
import os

import numpy as np
import pytest
import torch

from tandem.batch import Batch
from tandem.rewards import FormatTerm, LengthTerm, RewardManager, UnknownDataSourceError

PAD, EOS = 0, 1


class CharTokenizer:
    """Stand-in tokenizer: one id per character (its code point); 0 = pad, 1 = eos are special."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def batch_decode(self, seqs, skip_special_tokens=False):
        return ["".join(chr(i) for i in ids if not (skip_special_tokens and i in (PAD, EOS))) for ids in seqs]


def make_batch(texts, sources, ground_truths, extra_infos=None, width=None, tokenizer=None, eos=True):
    """Right-padded responses; each non-empty response ends with a (valid, special) EOS token."""
    encode = (tokenizer or CharTokenizer()).encode
    rows = [encode(t) + ([EOS] if t and eos else []) for t in texts]
    width = width or max(len(r) for r in rows) + 2
    responses = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        responses[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    non_tensors = {"data_source": sources, "ground_truth": ground_truths}
    non_tensors["extra_info"] = extra_infos if extra_infos is not None else [None] * len(texts)
    return Batch.from_dict({"responses": responses, "response_mask": mask}, non_tensors)


MIXED = dict(
    texts=["12+30=42", "41", "<answer>(5-3)*4*3</answer>", "so #### 1,234", "", "\\boxed{\\frac{1}{2}}"],
    sources=["addition", "addition", "countdown", "openai/gsm8k", "addition", "lighteval/MATH"],
    ground_truths=["42", "42", {"target": 24, "numbers": [3, 4, 5, 3]}, "1234", "7", "0.5"],
)


def test_in_process_exact_token_level_scores_and_metrics():
    manager = RewardManager(CharTokenizer(), num_workers=0)
    batch = make_batch(MIXED["texts"], MIXED["sources"], MIXED["ground_truths"], width=30)
    result = manager(batch)

    expected_scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    assert torch.equal(result.scores, expected_scores)
    expected = torch.zeros(6, 30)
    for i, text in enumerate(MIXED["texts"]):
        if text:  # the last valid token is the EOS after the text; the empty response gets nothing
            expected[i, len(text)] = expected_scores[i]
    assert result.token_level_scores.dtype == torch.float32
    assert torch.equal(result.token_level_scores, expected)
    assert result.metrics == {
        "reward/score_mean": pytest.approx(4 / 6),
        "reward/error_count": 0.0,
        "reward/timeout_count": 0.0,
        "reward/empty_response_count": 1.0,
        "reward/score_mean/addition": pytest.approx(1 / 3),
        "reward/score_mean/countdown": 1.0,
        "reward/score_mean/lighteval/MATH": 1.0,
        "reward/score_mean/openai/gsm8k": 1.0,
    }
    assert list(result.extra["error"]) == [""] * 6
    np.testing.assert_array_equal(result.extra["acc"], [1, 0, 1, 1, 0, 1])
    assert list(result.extra["pred"]) == ["42", "41", "(5-3)*4*3", "1234", None, "\\frac{1}{2}"]
    assert result.first_error is None


def test_last_valid_token_with_a_gap_in_the_mask():
    batch = make_batch(["42"], ["addition"], ["42"], width=6, eos=False)
    batch["response_mask"][0] = torch.tensor([1, 1, 0, 1, 0, 0])  # e.g. a masked tool-output token
    batch["responses"][0, 3] = ord(" ")
    result = RewardManager(CharTokenizer(), num_workers=0)(batch)
    assert result.token_level_scores[0].tolist() == [0, 0, 0, 1.0, 0, 0]


def test_terms_add_up_and_are_reported(tmp_path):
    scorer = tmp_path / "raising.py"
    scorer.write_text(
        "def compute_score(ds, s, gt, info=None):\n    if s == 'bad':\n        raise ValueError('x')\n    return 0.5\n"
    )
    manager = RewardManager(
        CharTokenizer(),
        num_workers=0,
        custom_reward_file=scorer,
        terms=(FormatTerm(r"^\d+$", match_reward=0.25, mismatch_reward=-1.0), LengthTerm(overlong_buffer=4)),
        max_response_length=8,  # lengths count the EOS token: "1234" is 5 tokens
    )
    result = manager(make_batch(["1234", "123456", "abcdefghi", "bad"], ["t"] * 4, ["-"] * 4))
    # scorer 0.5 + format + overlong (L=8, B=4): lengths 5, 7, 10 -> -0.25, -0.75, -1; "bad" failed -> 0 total
    np.testing.assert_allclose(result.extra["format"], [0.25, 0.25, -1.0, 0.0])
    np.testing.assert_allclose(result.extra["overlong"], [-0.25, -0.75, -1.0, 0.0])
    np.testing.assert_allclose(result.extra["scorer_score"], [0.5, 0.5, 0.5, 0.0])
    np.testing.assert_allclose(result.scores.numpy(), [0.5, 0.0, -1.5, 0.0])
    assert result.metrics["reward/format_mean"] == pytest.approx(-0.5 / 4)
    assert result.metrics["reward/error_count"] == 1.0
    assert result.first_error.startswith("sample 3 (data_source 't'): ValueError: x")
    assert manager.first_error == result.first_error


def test_unknown_data_source_is_an_error_not_a_zero():
    manager = RewardManager(CharTokenizer(), num_workers=0)
    with pytest.raises(UnknownDataSourceError, match="'my_task'.*scorer_overrides"):
        manager(make_batch(["1"], ["my_task"], ["1"]))


def test_with_a_reward_model_an_unscored_data_source_gets_rule_score_zero():
    # verl scores by the reward model alone; here the model's score is added to this 0 (trainer/rollouts.py)
    manager = RewardManager(CharTokenizer(), num_workers=0, reward_model=True)
    result = manager(make_batch(["1", "#### 2"], ["my_task", "gsm8k"], ["1", "2"]))
    assert result.scores.tolist() == [0.0, 1.0]  # my_task: no rule scorer; gsm8k: its rule, as before
    assert result.extra["scorer_score"].tolist() == [0.0, 1.0]
    manager.check_data_sources([("my_task", None)])  # no error
    assert list(manager.ground_truth_problems([("my_task", None, None)])) == []  # no ground truth needed


def test_routing_overrides_and_style(tmp_path):
    scorer = tmp_path / "mine.py"
    scorer.write_text("def half(ds, s, gt, info=None):\n    return {'score': 0.5, 'seen': ds}\n")
    manager = RewardManager(
        CharTokenizer(), num_workers=0, scorer_overrides={"my_task": "gsm8k", "other": f"{scorer}:half"}
    )
    batch = make_batch(
        ["#### 3", "x", "\\boxed{2}", "2"],
        ["my_task", "other", "olympiad", "addition"],
        ["3", "0", "2", "2"],
        extra_infos=[None, None, {"style": "math"}, {"style": "math"}],  # a data_source's own scorer wins
    )
    result = manager(batch)
    assert result.scores.tolist() == [1.0, 0.5, 1.0, 1.0]
    assert list(result.extra["seen"]) == [None, "other", None, None]


def test_construction_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="compute_score.*missing.py"):
        RewardManager(CharTokenizer(), custom_reward_file=tmp_path / "missing.py")
    (tmp_path / "r.py").write_text("def f(*a):\n    return 1.0\n")
    with pytest.raises(AttributeError, match="'compute_score'.*r.py"):
        RewardManager(CharTokenizer(), custom_reward_file=tmp_path / "r.py")
    with pytest.raises(ValueError, match="scorer_overrides\\['x'\\] = 'gsm9k'"):
        RewardManager(CharTokenizer(), scorer_overrides={"x": "gsm9k"})
    with pytest.raises(ValueError, match="taken"):
        RewardManager(CharTokenizer(), terms=(FormatTerm("a", name="error"),))


def test_real_char_tokenizer_skips_special_tokens():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = "0123456789+-*/()=<>#: abcdefghijklmnopqrstuvwxyz"
    vocab = {"<pad>": PAD, "<eos>": EOS, **{c: i + 2 for i, c in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    texts = ["answer: 12+30=42", "#### 5"]
    batch = make_batch(texts, ["addition", "gsm8k"], ["42", "6"], tokenizer=tokenizer)
    result = RewardManager(tokenizer, num_workers=0)(batch)
    assert result.scores.tolist() == [1.0, 0.0]
    assert list(result.extra["pred"]) == ["42", "5"]


def test_all_padding_batch():
    batch = make_batch(
        ["", "", ""], ["addition", "countdown", "gsm8k"], ["1", {"target": 1, "numbers": [1]}, "1"]
    )
    assert batch["response_mask"].sum() == 0 and batch["responses"].shape == (3, 2)
    manager = RewardManager(CharTokenizer(), num_workers=0, terms=(FormatTerm(r"\d", mismatch_reward=-1.0),))
    result = manager(batch)
    assert result.scores.tolist() == [-1.0, -1.0, -1.0]  # scored as empty text: wrong, and badly formatted
    assert torch.equal(result.token_level_scores, torch.zeros(3, 2))  # no token to put a score on
    assert (
        result.metrics["reward/empty_response_count"] == 3.0 and result.metrics["reward/error_count"] == 0.0
    )
    assert list(result.extra["error"]) == ["", "", ""]


def test_eos_in_the_middle_the_mask_decides():
    # "42", EOS, then tokens generated after it: the rollout's response_mask ends at the first EOS.
    responses = torch.tensor([[ord("4"), ord("2"), EOS, ord("9"), ord("9"), PAD]])
    cut = torch.tensor([[1, 1, 1, 0, 0, 0]])
    batch = Batch.from_dict(
        {"responses": responses, "response_mask": cut}, {"data_source": ["addition"], "ground_truth": ["42"]}
    )
    result = RewardManager(CharTokenizer(), num_workers=0)(batch)
    assert result.extra["pred"][0] == "42" and result.scores.tolist() == [1.0]
    assert result.token_level_scores.tolist() == [[0, 0, 1.0, 0, 0, 0]]  # on the EOS, the last scored token
    # A mask that runs past the EOS says those tokens are part of the response: they are scored too.
    batch["response_mask"] = torch.tensor([[1, 1, 1, 1, 1, 0]])
    result = RewardManager(CharTokenizer(), num_workers=0)(batch)
    assert result.extra["pred"][0] == "4299" and result.scores.tolist() == [0.0]


def test_mask_shape_must_match_responses():
    batch = make_batch(["1"], ["addition"], ["1"])
    bad = Batch.from_dict({"responses": batch["responses"], "response_mask": batch["response_mask"][:, :-1]},
                          {"data_source": ["addition"], "ground_truth": ["1"]})  # fmt: skip
    with pytest.raises(ValueError, match=r"response_mask has shape \(1, 3\) but responses \(1, 4\)"):
        RewardManager(CharTokenizer(), num_workers=0)(bad)


def test_unknown_data_source_fails_before_any_worker_starts():
    manager = RewardManager(CharTokenizer(), num_workers=2)
    batch = make_batch(
        ["1", "2", "3", "4"], ["addition", "my_task", "gsm8k", "my_task"], ["1", "2", "3", "4"]
    )
    with pytest.raises(UnknownDataSourceError) as info:
        manager(batch)
    assert str(info.value).startswith(
        "sample 1 of 4 (2 with this data_source): no reward scorer for data_source 'my_task'"
    )
    assert manager.worker_pids == []  # nothing was started, nothing half scored
    manager.close()


def test_custom_file_with_a_syntax_error_is_named(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def compute_score(ds, s, gt, info=None)\n    return 1.0\n")
    for kwargs in ({"custom_reward_file": path}, {"scorer_overrides": {"task": f"{path}:compute_score"}}):
        with pytest.raises(ImportError) as info:
            RewardManager(CharTokenizer(), **kwargs)
        message = str(info.value)
        assert f"in file '{path}': running the file failed: SyntaxError: expected ':' at line 1" in message


# --- worker processes ---------------------------------------------------------------------------

FLAKY = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise ValueError("boom on purpose")
    if solution_str == "sleep":
        time.sleep(3600)  # only a kill ends it: a pool that waited would hit the test's timeout
    if solution_str == "exit":
        os._exit(3)
    return {"score": float(solution_str == ground_truth), "pid": os.getpid()}
"""


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "flaky.py"
    path.write_text(FLAKY)
    manager = RewardManager(
        CharTokenizer(), scorer_overrides={"flaky": f"{path}:compute_score"}, timeout_s=1.0, num_workers=2
    )
    yield manager
    manager.close()


def test_pool_survives_errors_and_hangs(pooled):
    texts = ["a", "sleep", "c", "boom", "e", "f", "12+30=42"]
    batch = make_batch(texts, ["flaky"] * 6 + ["addition"], ["a", "-", "c", "-", "e", "x", "42"])
    pooled.chunk_size = 3  # the hang sits mid-chunk: "a" (done, unreported) and "c" (not started) are redone
    try:
        result = pooled(batch)
    finally:
        pooled.chunk_size = None
    assert result.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert result.metrics["reward/error_count"] == 1.0
    assert result.metrics["reward/timeout_count"] == 1.0
    errors = list(result.extra["error"])
    assert errors[1] == "timed out after 1 s (worker process killed)"
    assert errors[3].startswith("ValueError: boom on purpose (at flaky.py:")
    assert [e for i, e in enumerate(errors) if i not in (1, 3)] == [""] * 5
    assert result.first_error.startswith("sample 1 (data_source 'flaky'): timed out")
    assert all(pid is None or pid > 0 for pid in pooled.worker_pids)
    # the killed worker's process is gone, not left behind
    assert reward_workers() == {pid for pid in pooled.worker_pids if pid is not None}


def test_pool_reuses_workers_across_calls(pooled):
    batch = make_batch(["a", "b", "c", "d"], ["flaky"] * 4, ["a", "b", "x", "d"])
    first = pooled(batch)
    pids = pooled.worker_pids
    second = pooled(batch)
    assert first.scores.tolist() == second.scores.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert pooled.worker_pids == pids and None not in pids
    assert set(second.extra["pid"].astype(int)) <= set(pids)  # scored in those very processes
    assert os.getpid() not in pids


def test_pool_recovers_from_a_crashed_worker(pooled):
    batch = make_batch(["exit", "b", "\\boxed{3}"], ["flaky", "flaky", "lighteval/MATH"], ["-", "b", "3"])
    result = pooled(batch)
    assert result.scores.tolist() == [0.0, 1.0, 1.0]
    assert result.extra["error"][0] == "the reward worker process died (exit code 3)"
    assert result.metrics["reward/error_count"] == 1.0 and result.metrics["reward/timeout_count"] == 0.0


DETERMINISTIC = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise RuntimeError("boom on purpose")
    return {"score": len(solution_str) / 10, "echo": solution_str, "half": len(solution_str) % 2 == 0}
"""


def reward_workers() -> set[int]:
    return {p.pid for p in mp.active_children() if p.name == "tandem-reward-worker"}


def test_same_results_with_0_1_and_2_workers(tmp_path):
    path = tmp_path / "deterministic.py"
    path.write_text(DETERMINISTIC)
    texts = [*MIXED["texts"], "boom", "abc", "42", "no answer"] * 3
    sources = [*MIXED["sources"], "mine", "mine", "addition", "addition"] * 3
    truths = [*MIXED["ground_truths"], "-", "-", "forty-two", "7"] * 3  # "forty-two": a scorer error
    batch = make_batch(texts, sources, truths)
    kwargs = dict(scorer_overrides={"mine": f"{path}:compute_score"}, terms=(FormatTerm(r"\d"),))
    results = {}
    for num_workers, chunk_size in ((0, None), (1, None), (2, None), (2, 1), (2, 5)):
        with RewardManager(
            CharTokenizer(), num_workers=num_workers, chunk_size=chunk_size, **kwargs
        ) as manager:
            results[num_workers, chunk_size] = manager(batch)
    reference = results[0, None]
    assert reference.metrics["reward/error_count"] == 6.0  # 3 x "boom" and 3 x the broken ground truth
    for key, result in results.items():
        assert torch.equal(result.token_level_scores, reference.token_level_scores), key
        assert torch.equal(result.scores, reference.scores), key
        assert result.metrics == reference.metrics, key
        assert result.first_error == reference.first_error, key
        assert sorted(result.extra) == sorted(reference.extra) == [
            "acc", "echo", "error", "format", "half", "pred", "scorer_score",
        ], key  # fmt: skip
        for column in reference.extra:
            np.testing.assert_array_equal(
                result.extra[column], reference.extra[column], err_msg=f"{key} {column}"
            )
    assert reference.first_error.startswith(
        "sample 6 (data_source 'mine'): RuntimeError: boom on purpose (at deterministic.py:"
    )
    assert reference.extra["error"][8].startswith("ValueError: addition ground_truth must be a whole number")


def test_workers_are_gone_after_close_exit_and_garbage_collection():
    batch = make_batch(MIXED["texts"], MIXED["sources"], MIXED["ground_truths"])
    with RewardManager(CharTokenizer(), num_workers=2) as manager:
        in_process = RewardManager(CharTokenizer(), num_workers=0)(batch)
        assert torch.equal(manager(batch).token_level_scores, in_process.token_level_scores)
        pids = set(manager.worker_pids)
        assert len(pids) == 2 and pids <= reward_workers()
    # closed: the pool and its processes are gone ...
    assert manager.worker_pids == [] and not pids & reward_workers()
    for pid in pids:  # ... reaped, not left as zombies
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    manager.close()  # closing twice is fine

    forgotten = RewardManager(CharTokenizer(), num_workers=1)
    forgotten(batch)
    pids = set(forgotten.worker_pids)
    assert pids <= reward_workers()
    del forgotten
    gc.collect()
    assert not pids & reward_workers()


def test_pool_with_spawn_and_no_fork():
    from tandem.rewards import ScorerPool, gsm8k_score
    from tandem.rewards.scoring import Task, spec_key

    key = spec_key(gsm8k_score)
    tasks = [Task(key, "gsm8k", text, "3", None) for text in ("#### 3", "#### 4", "3")]
    pool = ScorerPool(1, timeout_s=5.0, start_method="spawn")
    try:
        outcomes = pool.run(tasks, {key: gsm8k_score}, chunk_size=2)
    finally:
        pool.close()
    assert [o.score for o in outcomes] == [1.0, 0.0, 0.0]  # gsm8k is strict: "3" has no "#### 3"
    assert pool.pids == [None]
    with pytest.raises(ValueError, match="fork"):
        ScorerPool(1, timeout_s=1.0, start_method="fork")


def test_from_config_wires_terms_and_custom_kwargs(tmp_path):
    from tandem.config import load_config
    from tandem.rewards import reward_manager_from_config

    scorer = tmp_path / "scaled.py"
    scorer.write_text(
        "def compute_score(ds, s, gt, info=None, scale=1.0):\n    return scale * float(s == gt)\n"
    )
    cfg = load_config(
        "dapo",
        [
            f"reward.custom_reward_file={scorer}",
            "reward.custom_reward_kwargs={scale: 2.0}",
            "reward.num_workers=1",
            "data.max_response_length=8",
            "reward.overlong.buffer_len=4",
        ],
    )
    with reward_manager_from_config(cfg, CharTokenizer()) as manager:
        result = manager(make_batch(["7", "7", "1234567"], ["t"] * 3, ["7", "8", "1234567"]))
    # kwargs reach the scorer in the worker (scale 2); DAPO's overlong term: L=8, B=4, lengths 2, 2, 8
    np.testing.assert_allclose(result.extra["scorer_score"], [2.0, 0.0, 2.0])
    np.testing.assert_allclose(result.extra["overlong"], [0.0, 0.0, -1.0])
    np.testing.assert_allclose(result.scores.numpy(), [2.0, 0.0, 1.0])


def test_custom_kwargs_without_a_file_is_an_error():
    with pytest.raises(ValueError, match="no custom_reward_file"):
        RewardManager(CharTokenizer(), num_workers=0, custom_reward_kwargs={"scale": 2})

import os
import time

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
    scorer.write_text("def compute_score(ds, s, gt, info=None):\n    if s == 'bad':\n        raise ValueError('x')\n    return 0.5\n")
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


# --- worker processes ---------------------------------------------------------------------------

FLAKY = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise ValueError("boom on purpose")
    if solution_str == "sleep":
        time.sleep(30)
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
        started = time.monotonic()
        result = pooled(batch)
        elapsed = time.monotonic() - started
    finally:
        pooled.chunk_size = None
    assert elapsed < 15, elapsed  # not 30 s: the hung worker was killed after ~1 s
    assert result.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert result.metrics["reward/error_count"] == 1.0
    assert result.metrics["reward/timeout_count"] == 1.0
    errors = list(result.extra["error"])
    assert errors[1] == "timed out after 1 s (worker process killed)"
    assert errors[3].startswith("ValueError: boom on purpose (at flaky.py:")
    assert [e for i, e in enumerate(errors) if i not in (1, 3)] == [""] * 5
    assert result.first_error.startswith("sample 1 (data_source 'flaky'): timed out")
    assert all(pid is None or pid > 0 for pid in pooled.worker_pids)


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
    batch = make_batch(["exit", "b", "\\boxed{3}"], ["flaky", "flaky", "math"], ["-", "b", "3"])
    result = pooled(batch)
    assert result.scores.tolist() == [0.0, 1.0, 1.0]
    assert result.extra["error"][0] == "the reward worker process died (exit code 3)"
    assert result.metrics["reward/error_count"] == 1.0 and result.metrics["reward/timeout_count"] == 0.0


def test_pool_agrees_with_in_process():
    batch = make_batch(MIXED["texts"] * 5, MIXED["sources"] * 5, MIXED["ground_truths"] * 5)
    with RewardManager(CharTokenizer(), num_workers=2) as manager:
        pooled_result = manager(batch)
        pids = manager.worker_pids
    in_process = RewardManager(CharTokenizer(), num_workers=0)(batch)
    assert torch.equal(pooled_result.token_level_scores, in_process.token_level_scores)
    assert pooled_result.metrics == in_process.metrics
    assert manager.worker_pids == []  # closed: the pool is gone ...
    for pid in pids:  # ... and so are its processes
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


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
    assert [o.score for o in outcomes] == [1.0, 0.0, 1.0]
    assert pool.pids == [None]
    with pytest.raises(ValueError, match="fork"):
        ScorerPool(1, timeout_s=1.0, start_method="fork")

"""agent/* metrics (trainer/metrics.py) on hand-built per-sample counts, and the counts the agent
loop writes against the masks of its own batch."""

import numpy as np
import pytest
import torch

from tandem.batch import Batch
from tandem.rollout import SamplingParams
from tandem.trainer.metrics import agent_metrics

from .test_agent import CALL, ScriptedModel, one_prompt, tool_loop

# Four trajectories: an answer without tools, two tool turns with a timeout then cut at the
# trajectory's time limit, one call then the budget ran out, and six calls cut by max_turns.
COUNTS = {
    "agent_turns": [1, 3, 2, 5],
    "agent_user_turns": [0, 1, 0, 0],
    "agent_tool_calls": [0, 2, 1, 6],
    "agent_tool_errors": [0, 1, 0, 2],
    "agent_tool_timeouts": [0, 1, 0, 0],
    "agent_tool_seconds": [0.0, 0.5, 0.25, 1.0],
    "agent_generated_tokens": [10, 30, 20, 50],
    "agent_inserted_tokens": [0, 12, 6, 40],
}
FINISH = ["answer", "time_limit", "budget", "max_turns"]


def counts_batch(counts=COUNTS, finish=FINISH) -> Batch:
    tensors = {key: torch.tensor(values, dtype=torch.float32) for key, values in counts.items()}
    return Batch.from_dict(tensors, {"agent_finish": np.array(finish, dtype=object)})


def test_agent_metrics_equal_hand_computed_values():
    assert agent_metrics(counts_batch()) == {
        "agent/turns/mean": 11 / 4,
        "agent/turns/max": 5.0,
        "agent/turns/min": 1.0,
        "agent/user_turns/mean": 1 / 4,
        "agent/tool_calls_per_sample": 9 / 4,
        "agent/tool_use_ratio": 3 / 4,  # 3 of 4 trajectories called a tool
        "agent/tool_errors": 3.0,
        "agent/tool_error_ratio": pytest.approx(3 / 9),  # errors per call, not per sample
        "agent/tool_timeouts": 1.0,
        "agent/tool_seconds": 1.75,
        "agent/finish_max_turns_ratio": 1 / 4,
        "agent/finish_budget_ratio": 1 / 4,
        "agent/finish_time_limit_ratio": 1 / 4,
        "agent/generated_tokens/mean": 110 / 4,
        "agent/inserted_tokens/mean": 58 / 4,
    }


def test_no_tool_calls_give_an_error_ratio_of_zero_not_nan():
    counts = {key: [0] * 2 for key in COUNTS} | {"agent_turns": [1, 1], "agent_generated_tokens": [4, 6]}
    metrics = agent_metrics(counts_batch(counts, ["answer", "answer"]))
    assert metrics["agent/tool_error_ratio"] == 0.0
    assert metrics["agent/tool_use_ratio"] == 0.0
    assert metrics["agent/finish_budget_ratio"] == 0.0
    assert metrics["agent/generated_tokens/mean"] == 5.0


def test_a_batch_of_the_synchronous_rollout_has_no_agent_metrics():
    batch = Batch.from_dict({"response_mask": torch.ones(2, 3, dtype=torch.long)})
    assert agent_metrics(batch) == {}


def test_generated_and_inserted_counts_are_the_masks_of_the_trajectory(tokenizer):
    model = ScriptedModel(tokenizer, [CALL, "408"])
    width = 160
    out = tool_loop(tokenizer, max_assistant_turns=3).generate(
        lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=width)
    )
    generated = out["response_mask"].sum(-1)
    trajectory = out["attention_mask"][:, -width:].sum(-1)
    # the model's two turns, each with its <|im_end|>; what the template put around the tool's "408"
    model_tokens = len(tokenizer(CALL + "<|im_end|>" + "408<|im_end|>")["input_ids"])
    inserted = len(tokenizer("\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
    assert out["agent_generated_tokens"].tolist() == generated.float().tolist() == [float(model_tokens)]
    assert (
        out["agent_inserted_tokens"].tolist()
        == (trajectory - generated).float().tolist()
        == [float(inserted)]
    )
    metrics = agent_metrics(out)
    assert metrics["agent/generated_tokens/mean"] == model_tokens
    assert metrics["agent/inserted_tokens/mean"] == inserted
    assert metrics["agent/turns/mean"] == 2.0 and metrics["agent/tool_calls_per_sample"] == 1.0

"""Faulty user tools through the whole stack: `tandem train` (GRPO, rollout.mode=async, vLLM, Ray) for
2 steps, with a tiny model fitted (plain PyTorch, seconds) to answer each prompt with one call:

- ``leave(code=2)``: a sync tool calling sys.exit (before: the rollout worker died),
- ``leave_async(code=3)``: the same in an async tool,
- ``wait_forever(x=1)``: a sync tool that never returns (before: the step waited for the worker timeout),
- ``python``: code forking 20 plain children that would write a file after the call's limit.

A reward function scores 1 where the model's observation of the call is the expected error text, so
reward/score_mean = 1 says every sample read exactly that; the metrics count the errors and timeouts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tandem.cli import main
from tandem.models.tiny import save_tiny
from tandem.tools import build_toolset

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared fixtures
from tools.verl_rows import fit_to_call, write_parquet

from .test_vllm import TINY_VLLM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOOL_TIMEOUT_S = 2
TOOL_FILE = """\
import sys, threading
from tandem.tools import tool

@tool
def leave(code: int) -> str:
    \"\"\"Ends the program.\"\"\"
    sys.exit(code)

@tool
async def leave_async(code: int) -> str:
    \"\"\"Ends the program, from a coroutine.\"\"\"
    sys.exit(code)

@tool
def wait_forever(x: int) -> str:
    \"\"\"Never returns.\"\"\"
    threading.Event().wait()
"""
FORKS = """\
import os, time
for i in range(20):
    if os.fork() == 0:
        time.sleep(4)
        open(os.path.join({folder!r}, str(i) + '-' + str(os.getpid())), 'w').write('outlived the call')
        os._exit(0)
time.sleep(60)
"""
SCORE_FILE = """\
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    observations = [m["content"] for m in extra_info["trajectory"]["messages"] if m["role"] == "tool"]
    return 1.0 if observations[:1] == [ground_truth] else 0.0
"""
TIMED_OUT = f"error: the tool did not answer within {TOOL_TIMEOUT_S} s"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_tools_that_exit_hang_or_fork_give_error_observations_and_the_run_trains_its_steps(
    ray_local, tmp_path
):
    outlived = tmp_path / "outlived"
    outlived.mkdir()
    cases = [  # (prompt, the call the model is fitted to write, the observation it must read)
        ("Exit please.", call("leave", code=2), "error: SystemExit: 2"),
        ("Exit from async.", call("leave_async", code=3), "error: SystemExit: 3"),
        ("Wait for ever.", call("wait_forever", x=1), TIMED_OUT),
        ("Fork children.", call("python", code=FORKS.format(folder=str(outlived))), TIMED_OUT),
    ]
    tool_file = tmp_path / "faulty_tools.py"
    tool_file.write_text(TOOL_FILE)
    (tmp_path / "score.py").write_text(SCORE_FILE)
    rows = [
        {
            "data_source": "faults",
            "prompt": [{"role": "user", "content": prompt}],
            "reward_model": {"style": "rule", "ground_truth": observation},
            "extra_info": {"index": i},
        }
        for i, (prompt, _, observation) in enumerate(cases)
    ]
    train = write_parquet(tmp_path / "train.parquet", rows)
    model = save_tiny(tmp_path / "model", stop_at_im_end=True, **TINY_VLLM)
    schemas = build_toolset(["python"], tool_file).schemas()  # as the run renders its prompts
    fit_to_call(model, [row["prompt"] for row in rows], [c for _, c, _ in cases], schemas)

    out = tmp_path / "run"
    started = time.monotonic()
    argv = [
        "train",
        "grpo",
        f"actor.model_path={model}",
        f"data.train_files=[{train}]",
        "data.max_prompt_length=1024",
        "data.max_response_length=512",
        "data.train_batch_size=4",
        "rollout.n=2",
        "rollout.temperature=0.3",  # the fitted call, every sample
        "actor.ppo_mini_batch_size=4",
        "actor.micro_batch_size_per_rank=8",
        "rollout.mode=async",
        "rollout.engine=vllm",
        "rollout.multi_turn.tools=[python]",
        f"rollout.multi_turn.tool_file={tool_file}",
        f"rollout.multi_turn.tool_timeout_s={TOOL_TIMEOUT_S}",
        "rollout.multi_turn.max_assistant_turns=2",  # one call run; the second turn ends the trajectory
        f"reward.custom_reward_file={tmp_path / 'score.py'}",
        "reward.num_workers=0",
        "trainer.total_training_steps=2",
        "trainer.workers_per_node=1",
        "trainer.device=cpu",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        "trainer.worker_timeout_s=600",
        f"trainer.output_dir={out}",
    ]
    assert main(argv) == 0  # before: SystemExit ended the rollout worker (WorkerDied)
    # a hung call held no step until the worker timeout
    assert time.monotonic() - started < 600
    metrics = [json.loads(line) for line in next(out.rglob("metrics.jsonl")).open()]
    steps = [m for m in metrics if "agent/tool_errors" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["reward/score_mean"] == 1.0  # every sample read its call's exact error observation
        assert m["agent/tool_calls_per_sample"] == 1.0
        assert m["agent/tool_errors"] == 8.0  # 4 prompts x 2 samples, every call a fault
        assert m["agent/tool_timeouts"] == 4.0  # the hanging function and the forking code
        assert m["agent/finish_time_limit_ratio"] == 0.0
    time.sleep(5)  # past the forked children's sleep
    assert list(outlived.iterdir()) == []  # none outlived its python call

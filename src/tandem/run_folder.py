"""The run folder, defined once: the names of its files and folders and the fields of its sample dumps, which
the trainer writes (`trainer/base.py`, `trainer/tracking.py`, `trainer/dumps.py`, `trainer/sft.py`) and
`tandem view` reads (`view/runs.py`, and the page's script `view/page/app.js`, whose field names a test keeps
equal to these). Plain names only: no torch, nothing of the rest of Tandem.

    <run>/config.yaml            the run's resolved config (also in each checkpoint)
    <run>/metrics.jsonl          one JSON object per step: {"step": 3, "time": ..., "<metric>": value, ...}
    <run>/val_generations.jsonl  with trainer.log_val_generations: the logged validation samples
    <run>/checkpoints/           the checkpoints (trainer/checkpoint.py: global_step_<N>/, ...)
    <run>/hf_model/              `tandem sft`: the trained model as a Hugging Face folder
    <dump dir>/<step>.jsonl      one sample per line (SAMPLE_FIELDS), in trainer.rollout_data_dir (training
                                 steps) and trainer.validation_data_dir (validation passes; 0: before training)
"""

from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
VAL_GENERATIONS_FILE = "val_generations.jsonl"
CHECKPOINTS_DIR = "checkpoints"
SFT_MODEL_DIR = "hf_model"

STEP = "step"  # the step of a metrics line and of a dump row
SFT_METRIC = "sft/loss"  # a metrics line of a `tandem sft` run (which dumps no samples)

# The two dump folders by the view's name for them, each with the config key (trainer.<key>) that names it; a
# folder at `<run>/<kind>` is read where the key is unset or relative to another directory.
DUMP_KINDS = {"rollouts": "rollout_data_dir", "validation": "validation_data_dir"}
DUMP_SUFFIX = ".jsonl"

# A dump row's fields (besides them, one field per reward term, named in `reward_keys`):
SAMPLE_FIELDS = (
    "input",  # the prompt as the model saw it (chat template applied, special tokens kept)
    "output",  # the response (a multi-turn trajectory: as one text)
    "gts",  # the ground truth
    "score",
    "step",
    "reward_keys",  # the names of the reward terms the row also holds
    "data_source",
    "uid",  # the prompt group
    "sample",  # the sample's index in its step
    "prompt_length",
    "response_length",
    "finish_reason",  # stop, length (or the agent loop's reason)
    "truncated",
    "advantage",  # training rows: the mean advantage over the response's tokens
    "rollout_mismatch",  # the mean |rollout - trainer log-prob| over the response's tokens
    "tokens",  # the response's tokens, with their mismatch in `token_mismatch`
    "token_mismatch",
    "num_turns",  # multi-turn rows: the trajectory's turns
    "turns",
    "reward_error",  # the scorer's error, when it raised
)
TURN_FIELDS = ("role", "text", "tool_calls", "error", "timed_out")  # each of a row's `turns`
TOOL_CALL_FIELDS = ("name", "arguments")  # each of a turn's `tool_calls`


def dump_file(folder: str | Path, step: int) -> Path:
    """The dump of `step` in a dump folder."""
    return Path(folder) / f"{step}{DUMP_SUFFIX}"


def dump_step(path: str | Path) -> int | None:
    """The step a dump file holds, None for a file that is not a dump."""
    path = Path(path)
    return int(path.stem) if path.suffix == DUMP_SUFFIX and path.stem.isdigit() else None


def dump_steps(folder: str | Path) -> list[int]:
    """The steps with a dump in `folder`, ascending."""
    steps = (dump_step(p) for p in Path(folder).glob(f"*{DUMP_SUFFIX}"))
    return sorted(s for s in steps if s is not None)

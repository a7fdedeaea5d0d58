"""The data section when about to train: the files must be there."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tandem.config.errors import Problems

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig

_DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def check_data(cfg: TandemConfig, problems: Problems) -> None:
    """Only when about to train: the data must be there."""
    d, t = cfg.data, cfg.trainer
    if not d.train_files:
        problems.add(
            "data.train_files",
            "data.train_files is empty: give parquet / jsonl files, e.g. data.train_files=[train.parquet]",
        )
    for key, files in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        for path in files:
            if "://" not in path and path.endswith(_DATA_SUFFIXES) and not Path(path).expanduser().is_file():
                problems.add(key, f"{key}: '{path}' does not exist")
    if not d.val_files and (t.test_freq > 0 or t.val_before_train):
        problems.add(
            ("data.val_files", "trainer.test_freq"),
            "trainer.test_freq / trainer.val_before_train ask for validation but data.val_files is "
            "empty: add val files or set trainer.test_freq=-1 and trainer.val_before_train=false",
        )
    if not cfg.actor.model_path:
        problems.add(
            "actor.model_path", "actor.model_path is not set: point it at a local Hugging Face folder"
        )


def check_sampler_class(cfg: TandemConfig, problems: Problems) -> None:
    """data.sampler_file is there and names its class (the class itself is loaded with the data, where a
    curriculum is refused in the async modes that draw a step's prompts early: trainer/ppo.py)."""
    d = cfg.data
    if d.sampler_class and not d.sampler_file:
        problems.add(
            ("data.sampler_class", "data.sampler_file"),
            f"data.sampler_class={d.sampler_class} needs data.sampler_file, the Python file that defines it "
            "(verl: data.sampler.class_path)",
        )
    if d.sampler_file and not d.sampler_class:
        problems.add(
            ("data.sampler_file", "data.sampler_class"),
            f"data.sampler_file={d.sampler_file} needs data.sampler_class, the name of the sampler class in it "
            "(verl: data.sampler.class_name)",
        )
    if not d.sampler_file:
        return
    path = d.sampler_file.removeprefix("file://")
    if not path.startswith("pkg://") and not Path(path).expanduser().is_file():
        problems.add(
            "data.sampler_file",
            f"data.sampler_file: '{d.sampler_file}' does not exist (relative paths start at the current folder)",
        )

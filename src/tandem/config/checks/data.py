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

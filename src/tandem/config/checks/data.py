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
        for path in files if not d.custom_dataset_file else ():  # a user's class reads its files as it likes
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
    _file_and_class(
        problems,
        ("data.sampler_file", d.sampler_file, "data.sampler.class_path"),
        ("data.sampler_class", d.sampler_class, "data.sampler.class_name"),
        "sampler class",
    )


def check_dataset_class(cfg: TandemConfig, problems: Problems) -> None:
    """data.custom_dataset_file is there and names its class (the class itself is loaded with the data, before
    any worker starts: trainer/ppo.py)."""
    d = cfg.data
    _file_and_class(
        problems,
        ("data.custom_dataset_file", d.custom_dataset_file, "data.custom_cls.path"),
        ("data.custom_dataset_class", d.custom_dataset_class, "data.custom_cls.name"),
        "Dataset class",
    )


def _file_and_class(
    problems: Problems, file: tuple[str, str | None, str], cls: tuple[str, str | None, str], what: str
) -> None:
    """A user's class named by two keys, each given as (key, value, verl's key): the file and the class's name.
    Each needs the other, and the file must be there (a pkg:// module is imported when the run starts)."""
    (file_key, path, verl_file), (class_key, name, verl_class) = file, cls
    if name and not path:
        problems.add(
            (class_key, file_key),
            f"{class_key}={name} needs {file_key}, the Python file that defines it (verl: {verl_file})",
        )
    if not path:
        return
    if not name:
        problems.add(
            (file_key, class_key),
            f"{file_key}={path} needs {class_key}, the name of the {what} in it (verl: {verl_class})",
        )
    local = path.removeprefix("file://")
    if not local.startswith("pkg://") and not Path(local).expanduser().is_file():
        problems.add(
            file_key, f"{file_key}: '{path}' does not exist (relative paths start at the current folder)"
        )

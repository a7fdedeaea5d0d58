"""Datasets for Tandem: RL prompts, SFT pairs, built-in synthetic tasks (the tiny model is in tandem.models)."""

from tandem.data.padding import pad_sequences, position_ids_from_mask
from tandem.data.prompts import PromptDataset, collate_prompts
from tandem.data.rows import DataError
from tandem.data.sampler import StatefulSampler
from tandem.data.sft import SFTDataset, collate_sft
from tandem.data.synthetic import TASKS, make_rows, write_rows, write_splits, write_task

__all__ = [
    "TASKS",
    "DataError",
    "PromptDataset",
    "SFTDataset",
    "StatefulSampler",
    "collate_prompts",
    "collate_sft",
    "make_rows",
    "pad_sequences",
    "position_ids_from_mask",
    "write_rows",
    "write_splits",
    "write_task",
]

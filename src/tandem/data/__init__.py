"""Datasets for Tandem: RL prompts, SFT pairs, built-in synthetic tasks (the tiny model is in tandem.models)."""

from tandem.data.padding import pad_sequences, position_ids_from_mask
from tandem.data.prompts import PromptDataset, collate_prompts
from tandem.data.rows import DataError
from tandem.data.sampler import StatefulSampler
from tandem.data.sft import SFTDataset, collate_sft
from tandem.data.synthetic import TASKS, make_rows, write_rows, write_splits, write_task
from tandem.data.user_sampler import DATASET_INDEX, SamplerBatch, UserSampler, sampler_batch, sampler_config

__all__ = [
    "DATASET_INDEX",
    "TASKS",
    "DataError",
    "PromptDataset",
    "SFTDataset",
    "SamplerBatch",
    "StatefulSampler",
    "UserSampler",
    "collate_prompts",
    "collate_sft",
    "make_rows",
    "pad_sequences",
    "position_ids_from_mask",
    "sampler_batch",
    "sampler_config",
    "write_rows",
    "write_splits",
    "write_task",
]

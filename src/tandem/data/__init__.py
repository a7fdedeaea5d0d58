"""Datasets for Tandem: RL prompts, SFT pairs, built-in synthetic tasks, a tiny local model."""

from tandem.data.padding import pad_sequences, position_ids_from_mask
from tandem.data.prompts import PromptDataset, collate_prompts
from tandem.data.rows import DataError
from tandem.data.sampler import StatefulSampler
from tandem.data.sft import SFTDataset, collate_sft
from tandem.data.synthetic import TASKS, make_rows, write_rows, write_splits, write_task
from tandem.data.tiny import build_model, build_tokenizer, padded_vocab_size, save_tiny, save_tokenizer

__all__ = [
    "TASKS",
    "DataError",
    "PromptDataset",
    "SFTDataset",
    "StatefulSampler",
    "build_model",
    "build_tokenizer",
    "collate_prompts",
    "collate_sft",
    "make_rows",
    "pad_sequences",
    "padded_vocab_size",
    "position_ids_from_mask",
    "save_tiny",
    "save_tokenizer",
    "write_rows",
    "write_splits",
    "write_task",
]

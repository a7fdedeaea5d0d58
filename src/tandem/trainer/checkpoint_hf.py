"""The Hugging Face folder every actor checkpoint holds, `global_step_N/actor/huggingface/`, where verl's
tools look for it.

verl writes `actor/huggingface/` with every checkpoint: the model's config.json, the tokenizer / processor
and the generation config always, the weights only with 'hf_model' in its checkpoint save_contents.
Tandem does the same (`trainer.save_hf_model`); `tandem export CHECKPOINT CHECKPOINT/actor/huggingface`
(`commands/export.py`) fills the weights in afterwards.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tandem.config.schema import TandemConfig
from tandem.controller import WorkerGroup
from tandem.engine.hf_io import copy_side_files

HF_FOLDER = "huggingface"  # global_step_N/<role>/huggingface, as verl names it


def hf_folder(checkpoint: str | Path, role: str = "actor") -> Path:
    """Where a checkpoint keeps the role's Hugging Face folder (verl's global_step_N/actor/huggingface)."""
    return Path(checkpoint) / role / HF_FOLDER


def write_checkpoint_hf(cfg: TandemConfig, actor_group: WorkerGroup, checkpoint: Path) -> Path:
    """The actor's Hugging Face folder inside a checkpoint being written: with trainer.save_hf_model the
    full model (as `tandem export` writes it), else its config, tokenizer and generation files alone."""
    out = hf_folder(checkpoint)
    if cfg.trainer.save_hf_model:
        actor_group.export_hf("actor", str(out))
    else:
        out.mkdir(parents=True, exist_ok=True)
        copy_side_files(cfg.actor.model_path, out)
        shutil.copy2(Path(cfg.actor.model_path) / "config.json", out / "config.json")
    copy_tokenizer(cfg, out)
    return out


def copy_tokenizer(cfg: TandemConfig, out: Path) -> None:
    """The tokenizer the run used, when actor.tokenizer_path names a folder of its own."""
    a = cfg.actor
    if a.tokenizer_path and Path(a.tokenizer_path).resolve() != Path(a.model_path).resolve():
        copy_side_files(a.tokenizer_path, out)

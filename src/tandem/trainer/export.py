"""`tandem export`: a Hugging Face folder from a checkpoint, in this process (no Ray); and the Hugging Face
folder every actor checkpoint holds, `global_step_N/actor/huggingface/`, where verl's tools look for it.

torch.distributed.checkpoint reshards on load, so a checkpoint written by any number of ranks
loads into the one rank here. The engine is first built from the model_path recorded in the
checkpoint's config (the architecture and tokenizer come from there), then the weights are loaded.

verl writes `actor/huggingface/` with every checkpoint: the model's config.json, the tokenizer / processor
and the generation config always, the weights only with 'hf_model' in its checkpoint save_contents.
Tandem does the same (`trainer.save_hf_model`); `tandem export CHECKPOINT CHECKPOINT/actor/huggingface`
fills the weights in afterwards (and records them in the checkpoint's manifest).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tandem.config import load_config
from tandem.config.schema import TandemConfig
from tandem.controller import WorkerGroup
from tandem.engine.hf_io import copy_side_files
from tandem.roles.worker import RoleWorker
from tandem.trainer.checkpoint import PARTIAL, CheckpointManager, write_manifest

EXPORTABLE = ("actor", "critic")
HF_FOLDER = "huggingface"  # global_step_N/<role>/huggingface, as verl names it
ONE_RANK = [
    "trainer.backend=inprocess",
    "trainer.nnodes=1",
    "trainer.workers_per_node=1",
    "trainer.device=cpu",
    "trainer.resume=disable",
    # One rank holds the whole model: megatron's distributed checkpoint reshards a TP / PP-sharded one.
    "actor.megatron.tensor_parallel=1",
    "actor.megatron.pipeline_parallel=1",
    "actor.megatron.virtual_pipeline=1",
    "actor.megatron.expert_parallel=1",  # experts are saved under their global index
    "actor.megatron.context_parallel=1",  # context-parallel ranks hold the same weights
    "actor.fsdp.sequence_parallel=1",  # the DCP checkpoint of FSDP2 reshards the same way
    "rollout.tensor_parallel=1",  # no rollout engine is built for an export
]


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
    _copy_tokenizer(cfg, out)
    return out


def _copy_tokenizer(cfg: TandemConfig, out: Path) -> None:
    """The tokenizer the run used, when actor.tokenizer_path names a folder of its own."""
    a = cfg.actor
    if a.tokenizer_path and Path(a.tokenizer_path).resolve() != Path(a.model_path).resolve():
        copy_side_files(a.tokenizer_path, out)


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path | None = None, role: str = "actor") -> Path:
    """Write checkpoint/<role> as a Hugging Face folder at out_dir; returns out_dir. An out_dir that is the
    checkpoint's own `<role>/huggingface` (None: that one) is replaced whole and the checkpoint's manifest
    rewritten."""
    if role not in EXPORTABLE:
        raise ValueError(f"tandem export: role must be one of {EXPORTABLE}, got {role!r}")
    folder = CheckpointManager(Path(checkpoint).parent).resolve(str(checkpoint))
    if not (folder / role).is_dir():
        raise FileNotFoundError(f"checkpoint {folder} holds no {role!r} (it has no {role}/ folder)")
    out_dir = hf_folder(folder, role) if out_dir is None else out_dir
    in_place = Path(out_dir).resolve() == hf_folder(folder, role).resolve()
    target = hf_folder(folder, role).with_name(PARTIAL + HF_FOLDER) if in_place else Path(out_dir)
    if in_place:
        shutil.rmtree(target, ignore_errors=True)
    cfg = load_config(folder / "config.yaml", ONE_RANK)
    group = WorkerGroup.inprocess(RoleWorker, name="export", args=(cfg, [role]))
    try:
        # The weights alone: an optimizer's state need not reshard to one rank (megatron keeps a mixture-of-
        # experts model's expert optimizer apart under expert parallel, not on one rank).
        group.load_checkpoint(str(folder), weights_only=True)
        group.export_hf(role, str(target))
    finally:
        group.shutdown()
    if role == "actor":
        _copy_tokenizer(cfg, target)
    if in_place:  # the checkpoint was verified above: its manifest now lists the new files instead
        shutil.rmtree(hf_folder(folder, role), ignore_errors=True)
        target.rename(hf_folder(folder, role))
        write_manifest(folder)
    return Path(out_dir)

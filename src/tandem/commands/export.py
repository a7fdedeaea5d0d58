"""`tandem export`: a Hugging Face folder from a checkpoint, in this process (no Ray).

torch.distributed.checkpoint reshards on load, so a checkpoint written by any number of ranks
loads into the one rank here. The engine is first built from the model_path recorded in the
checkpoint's config (the architecture and tokenizer come from there), then the weights are loaded.

Every actor checkpoint holds `actor/huggingface/` (`trainer/checkpoint_hf.py`), with the weights only under
`trainer.save_hf_model`; `tandem export CHECKPOINT CHECKPOINT/actor/huggingface` fills the weights in
afterwards (and records them in the checkpoint's manifest).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tandem.config import load_config
from tandem.controller import WorkerGroup
from tandem.roles.worker import RoleWorker
from tandem.run_folder import CONFIG_FILE
from tandem.trainer.checkpoint import PARTIAL, CheckpointManager, write_manifest
from tandem.trainer.checkpoint_hf import HF_FOLDER, copy_tokenizer, hf_folder

EXPORTABLE = ("actor", "critic")
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
    cfg = load_config(folder / CONFIG_FILE, ONE_RANK)
    group = WorkerGroup.inprocess(RoleWorker, name="export", args=(cfg, [role]))
    try:
        # The weights alone: an optimizer's state need not reshard to one rank (megatron keeps a mixture-of-
        # experts model's expert optimizer apart under expert parallel, not on one rank).
        group.load_checkpoint(str(folder), weights_only=True)
        group.export_hf(role, str(target))
    finally:
        group.shutdown()
    if role == "actor":
        copy_tokenizer(cfg, target)
    if in_place:  # the checkpoint was verified above: its manifest now lists the new files instead
        shutil.rmtree(hf_folder(folder, role), ignore_errors=True)
        target.rename(hf_folder(folder, role))
        write_manifest(folder)
    return Path(out_dir)

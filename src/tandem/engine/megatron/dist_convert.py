"""`tandem convert`: a Hugging Face folder <-> a megatron distributed checkpoint of its weights (the format of
dist_start.py, what verl's `dist_checkpointing_path` and Tandem's `actor.megatron.dist_checkpoint` name).

Both run in this process on the CPU, as one rank (a gloo group of one is started when none is up): megatron's
checkpoint reshards on load, so what one rank writes loads under any tensor / pipeline / expert layout, and one
rank reads any layout's checkpoint. The weights go through the megatron engine's own conversion (convert.py),
the one a run uses, in float32; a run in bfloat16 casts them as it loads.

verl's `scripts/converter_hf_to_mcore.py` builds megatron's model with Transformer Engine (a GPU) and writes
bfloat16; here the local layer spec on a CPU writes float32 under the same keys (megatron maps the local spec's
norm names to Transformer Engine's), so either tool's checkpoint starts either trainer.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

from tandem.engine.base import EngineSpec, Head
from tandem.engine.megatron.dist_start import check_folder


@contextlib.contextmanager
def _one_rank() -> Iterator[None]:
    """A one-rank gloo group for the conversion, unless this process is in one already."""
    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory(prefix="tandem-convert-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _engine(model_dir: str | Path, head: Head, checkpoint: str | Path | None = None):  # -> MegatronEngine
    from tandem.engine.megatron.engine import MegatronEngine

    spec = EngineSpec(
        model_path=model_dir,
        head=head,
        device="cpu",
        strategy="megatron",
        dist_checkpoint=checkpoint,
        dist_checkpoint_key="CHECKPOINT",
    )
    return MegatronEngine(spec)


def hf_to_mcore(model_dir: str | Path, out_dir: str | Path, head: Head = "lm") -> Path:
    """Write the weights of the Hugging Face folder `model_dir` as a megatron distributed checkpoint in
    `out_dir` (new or empty); returns it."""
    out = Path(out_dir)
    if out.is_dir() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: give a new folder for the checkpoint")
    with _one_rank():
        _engine(model_dir, head).save_weights(out)
    return out


def mcore_to_hf(
    checkpoint: str | Path, model_dir: str | Path, out_dir: str | Path, head: Head = "lm"
) -> Path:
    """Write the megatron distributed checkpoint `checkpoint` as a Hugging Face folder in `out_dir`, with the
    config, tokenizer and generation files of `model_dir` (the folder it was converted from, or any of the same
    architecture); returns it."""
    check_folder(checkpoint, "CHECKPOINT")
    with _one_rank():
        _engine(model_dir, head, checkpoint).export_hf(out_dir)
    return Path(out_dir)

"""A megatron distributed checkpoint as a model's starting weights (verl's `use_dist_checkpointing` /
`dist_checkpointing_path`: `actor.megatron.dist_checkpoint`, `critic.megatron_dist_checkpoint`), and the
conversions between such a checkpoint and a Hugging Face folder (`tandem convert`).

The format. A folder megatron-core's `dist_checkpointing.save` wrote from a GPTModel's `sharded_state_dict()`
(no key prefix: verl's `dist_checkpointing_prefix` ''): tensors under megatron's names with the layers stacked
on a leading axis (`decoder.layers.self_attention.linear_qkv.weight` [layers, ...], global layer numbers),
whole (unsplit) shapes in its metadata, so any tensor / pipeline / expert layout loads it (megatron reshards on
load). verl's `scripts/converter_hf_to_mcore.py` writes this; so does `tandem convert hf-to-mcore`, and a Tandem
checkpoint's `actor/` (or `critic/`) folder is one too (its optimizer entries are not read here). megatron's
local layer spec (what Tandem builds) saves its norms under Transformer Engine's names
(`self_attention.linear_qkv.layer_norm_weight`), so a checkpoint written with either spec reads into both.

Where Tandem differs from verl. verl loads with megatron's "unexpected keys are fine" and so starts silently
from a model's own random initialisation wherever a checkpoint lacks a weight; here every weight the model
needs must be in the checkpoint with the model's shape, and a model weight in the checkpoint the model does not
have (another number of layers, an untied output layer for a tied model) is an error too, each naming the
keys. A critic (value head) drops the checkpoint's output layer as verl does, unless the checkpoint holds a
value head of its own (a Tandem critic checkpoint): then it starts from that head. A dropped head starts as a
Hugging Face token classifier's missing `score` does (normal(0, initializer_range) from the seed, bias 0), so
the critic starts from the same weights as from the Hugging Face folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MARKER = "metadata.json"  # what megatron's dist_checkpointing writes into every checkpoint folder
_MODEL_PREFIXES = ("embedding.", "decoder.", "output_layer.")
_HEAD = "output_layer."


def check_folder(path: str | Path, key: str) -> Path:
    """`path` as a Path when it is a megatron distributed checkpoint; an error naming `key` otherwise."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{key}={path}: no such folder; give a megatron distributed checkpoint (`tandem convert hf-to-mcore "
            "MODEL_DIR OUT_DIR` writes one from a Hugging Face folder)"
        )
    if not (folder / MARKER).is_file():
        raise FileNotFoundError(
            f"{key}={path}: not a megatron distributed checkpoint (no {MARKER}); `tandem convert hf-to-mcore "
            "MODEL_DIR OUT_DIR` writes one from a Hugging Face folder"
        )
    return folder


def value_head_init(head: nn.Module, config: Any, seed: int) -> None:
    """A value head as transformers initialises a token classifier's `score` missing from a causal-LM folder
    (hf_io.load_pretrained: normal(0, initializer_range) drawn first after seeding, bias 0)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        weight = torch.empty(tuple(head.weight.shape)).normal_(0.0, config.initializer_range)
        head.weight.copy_(weight)
        head.bias.zero_()


def _wanted(sharded: dict[str, Any]) -> dict[str, tuple[int, ...] | None]:
    """The checkpoint keys a sharded state dict reads: key -> whole shape (None: a factory's, checked by
    megatron on load). megatron's extra-state objects are left out (see `load_start_weights`)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    out: dict[str, tuple[int, ...] | None] = {}
    for item in nested_values(sharded):
        if isinstance(item, ShardedTensor):
            out[item.key] = tuple(item.global_shape)
        elif isinstance(item, ShardedTensorFactory):
            out[item.key] = None
    return out


def _drop(sharded: dict[str, Any], keep: Any) -> dict[str, Any]:
    """The sharded state dict without the entries `keep(value)` refuses (nested dicts kept)."""
    out = {}
    for name, value in sharded.items():
        if isinstance(value, dict):
            out[name] = _drop(value, keep)
        elif keep(value):
            out[name] = value
    return out


def _keys_list(keys: list[str]) -> str:
    return ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")


def load_start_weights(chunks: list[nn.Module], path: str | Path, key: str, head: str) -> None:
    """Fill this rank's model chunks (one per virtual stage) from the distributed checkpoint at `path` (named
    `key` in errors). Run it inside the CPU adapter's scope on a CPU (megatron's loader makes CUDA literals)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    folder = check_folder(path, key)
    stored = {
        name: tuple(t.global_shape)
        for name, t in dist_checkpointing.load_tensors_metadata(str(folder)).items()
    }
    names = ["model"] if len(chunks) == 1 else [f"model{c}" for c in range(len(chunks))]
    sharded = {name: chunk.sharded_state_dict() for name, chunk in zip(names, chunks, strict=True)}
    # megatron's extra state (Transformer Engine's FP8 metadata; None in the local spec Tandem builds) is
    # not weights: not read, so a checkpoint of either layer spec loads
    sharded = _drop(sharded, lambda v: not isinstance(v, ShardedObject))
    wanted = _wanted(sharded)
    own_head = (
        head == "value"
        and _HEAD + "weight" in stored
        and stored[_HEAD + "weight"] == wanted.get(_HEAD + "weight")
    )
    if head == "value" and not own_head:  # the value head stays as built (value_head_init)
        sharded = _drop(sharded, lambda v: not getattr(v, "key", "").startswith(_HEAD))
        wanted = {k: s for k, s in wanted.items() if not k.startswith(_HEAD)}
    problems = []
    missing = sorted(k for k in wanted if k not in stored)
    if missing:
        problems.append(f"the model needs weights it does not hold: {_keys_list(missing)}")
    shapes = sorted(
        f"{k} {stored[k]} (the model's {s})"
        for k, s in wanted.items()
        if s is not None and k in stored and stored[k] != s
    )
    if shapes:
        problems.append(f"weights of another shape: {_keys_list(shapes)}")
    # a pipeline stage reads its own layers' keys: a weight no rank reads is one the model does not have
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sorted(wanted))
    read = set().union(*everyone)
    extra = sorted(
        k
        for k in stored
        if k.startswith(_MODEL_PREFIXES) and k not in read and not (head == "value" and k.startswith(_HEAD))
    )
    if extra:
        problems.append(f"it holds weights the model does not have: {_keys_list(extra)}")
    if problems:
        raise ValueError(
            f"{key}={path}: this checkpoint is not of the model its Hugging Face folder describes ("
            + "; ".join(problems)
            + "). Convert the model's own folder with `tandem convert hf-to-mcore`"
        )
    state = dist_checkpointing.load(sharded, str(folder), strict=StrictHandling.ASSUME_OK_UNEXPECTED)
    for name, chunk in zip(names, chunks, strict=True):
        result = chunk.load_state_dict(state[name], strict=False)
        unfilled = [
            k
            for k in result.missing_keys
            if not k.endswith("_extra_state") and not (head == "value" and k.startswith(_HEAD))
        ]
        if unfilled or result.unexpected_keys:
            raise ValueError(
                f"{key}={path}: parameters left unfilled {unfilled}, unread {result.unexpected_keys}"
            )

"""Low-rank adapters (LoRA) on the FSDP2 engine: only the adapters train (`actor.lora`).

PEFT's `inject_adapter_in_model` puts a LoRA layer around each targeted linear of the Hugging Face model in
place (no PeftModel wrapper: the model, its head and its decoder layers stay what the engine shards), and
freezes every other weight. A targeted linear `x.proj` then holds `x.proj.base_layer.weight` (frozen) and
`x.proj.lora_A.default.weight` [r, in], `x.proj.lora_B.default.weight` [out, r] (trained; B starts at 0,
so the model starts as the base model), and computes W x + (alpha / r) B A x.

What the rest of Tandem sees:
- the optimizer holds the adapters only (its state is 2 x the adapters' size, not 2 x the model's);
- `merged_weights`: the weights under the Hugging Face names with each adapter folded in (W + (alpha / r)
  B A): what the rollout engine loads and what an export writes, so vLLM and HF rollouts run the plain
  architecture at full speed;
- `adapter_disabled`: the forward of the base model, adapters off, which is the reference policy: no
  second copy of the base weights (`WithoutAdapter`);
- `adapter_state` / `save_adapter`: the adapters alone as a PEFT adapter folder.

A mixture-of-experts model (Qwen3-MoE, ...) keeps its experts in fused tensors, not linears: `mlp.experts`'s
gate_up_proj [E, 2I, H] and down_proj [E, H, I]. With target_modules all-linear, or naming gate / up / down_proj,
PEFT (0.21) wraps each such tensor in a ParamWrapper (nested, one per tensor: `mlp.experts.base_layer` adapts
gate_up_proj, `mlp.experts` down_proj; a router's `mlp.gate.weight` too) whose A is [E r, in] and B [out, E r]:
one rank-r adapter per expert. `merged_weights` folds each expert's own update into its slice of the fused tensor
as PEFT's merge does (`delta_weight`), under the plain names (`model.layers.N.mlp.experts.gate_up_proj`), and the
adapter folder holds them under PEFT's names, which PEFT loads. The megatron engine builds the same adapters, one
per expert (engine/megatron/lora.py `ExpertAdapters`), but none on the routers. The rollout gets them merged:
the adapter sync (rollout_sync=adapter) refuses them (roles/rollout.py `check_servable_adapters`), as vLLM's serving of PEFT's
fused expert adapters is not checked here.

Two ways in which the adapters' layout may be given, beyond rank and targets:
- `actor.lora.adapter_path`: a PEFT adapter folder to start from. Its own adapter_config.json places the
  adapters (as verl's FSDP workers, which load it with `PeftModel.from_pretrained`), and its weights replace the
  new ones before the model is sharded (`load_saved_adapter`).
- `exclude_modules`: modules that get no adapter. PEFT reads a string as one regular expression over a module's
  whole name and a list as names or ends of names; Tandem reads each entry both ways, and also excludes what
  is inside an excluded module (`visual` keeps adapters out of the whole vision tower, where PEFT's list would
  exclude a module named `visual` only, which is no linear, so nothing). `exclude_regex` writes that rule as the
  one regular expression PEFT takes, so a saved adapter folder reloads with the same layout. An entry that names
  no module of the model is an error: a misspelt name would otherwise silently adapt what it meant to leave out.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tandem.config.lora_names import ADAPTER_CONFIG, ADAPTER_WEIGHTS, hf_target_modules
from tandem.engine.base import TrainEngine

ADAPTER = "default"  # PEFT's name for the one adapter


def saved_adapter(settings: Any) -> str | None:
    """The adapter folder the adapters start from (`actor.lora.adapter_path`), or None: new adapters. The
    critic's settings have no such key (a PEFT adapter folder holds no value head)."""
    return getattr(settings, "adapter_path", None)


def enabled(settings: Any) -> bool:
    """Whether `settings` (`actor.lora`, `critic.lora`) asks for adapters: a rank, or an adapter folder."""
    return settings is not None and (settings.rank > 0 or saved_adapter(settings) is not None)


def exclude_regex(entries: Sequence[str]) -> str | None:
    """`exclude_modules` as the one regular expression PEFT fullmatches against each module's name: an entry
    matches a module it names, whose dotted name it ends, or whose whole name it matches as a regular expression,
    and every module inside one it matches. None for no entries."""
    if not entries:
        return None
    either = "|".join(f"(?:.*\\.)?{re.escape(entry)}|(?:{entry})" for entry in entries)
    return f"(?:{either})(?:\\..*)?"


def unmatched_excludes(model: nn.Module, entries: Sequence[str]) -> list[str]:
    """The entries of `exclude_modules` that name no module of `model`."""
    names = [name for name, _ in model.named_modules() if name]
    return [
        entry
        for entry in entries
        if not any(re.fullmatch(exclude_regex([entry]), name) for name in names)  # type: ignore[arg-type]
    ]


def lora_config(settings: Any, whole: Sequence[str] = ()) -> Any:
    """PEFT's LoraConfig from `actor.lora` / `critic.lora` (rank, alpha, dropout, target_modules,
    exclude_modules); modules named in `whole` get no adapter. With an adapter folder to start from, that
    folder's own config, trainable."""
    from peft import LoraConfig

    folder = saved_adapter(settings)
    if folder is not None:
        config = LoraConfig.from_pretrained(folder)
        config.inference_mode = False  # PEFT saves it True: its adapters would load frozen
        return config
    targets = hf_target_modules(settings.target_modules)  # verl's megatron names as the projections they fuse
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        exclude_modules=exclude_regex([*settings.exclude_modules, *whole]),
        bias="none",
    )


def inject(
    model: nn.Module, settings: Any, seed: int, whole: Sequence[str] = (), init_a: str = "kaiming"
) -> nn.Module:
    """LoRA layers into `model` in place (A from `seed` alone, B = 0); everything else frozen but the modules
    named in `whole`, which train whole (a critic's new value head: an adapter on a random head would leave
    the head itself random). An exclude_modules entry that names no module of `model` is an error.

    `init_a`: kaiming draws A as PEFT does (kaiming-uniform, a = sqrt(5)); xavier redraws each A [r, in]
    xavier-uniform, U(-b, b) with b = sqrt(6 / (in + r)), layer by layer in PEFT's order, as megatron-bridge
    (verl's megatron LoRA) draws it (the engine resolves lora.init_a=auto: train_engine_options.py)."""
    from peft import inject_adapter_in_model

    unmatched = [] if saved_adapter(settings) else unmatched_excludes(model, settings.exclude_modules)
    if unmatched:
        some = [name for name, _ in model.named_modules() if name.count(".") <= 1 and name]
        raise ValueError(
            f"lora.exclude_modules: {unmatched} name no module of {type(model).__name__} (a name, the end of a "
            f"dotted name, or a regular expression over the whole name; its modules include {some[:8]}); fix "
            "the entry or remove it"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            inject_adapter_in_model(lora_config(settings, whole), model)
        except ValueError as error:  # PEFT's ParamWrapper (fused experts, routers) takes no dropout
            if "ParamWrapper does not work with lora_dropout" not in str(error):
                raise
            raise ValueError(
                f"actor.lora.dropout={settings.dropout} with target_modules={list(settings.target_modules)!r}: "
                "the adapters on a mixture-of-experts model's fused experts and routers (PEFT's ParamWrapper) "
                "take no dropout; set actor.lora.dropout=0, or name the projections to adapt without the "
                "experts' gate_proj / up_proj / down_proj (e.g. [q_proj,k_proj,v_proj,o_proj])"
            ) from error
        if init_a == "xavier" and saved_adapter(settings) is None:
            _xavier_a(lora_layers(model))
    for name in whole:
        model.get_submodule(name).requires_grad_(True)
    layers = lora_layers(model)
    if not layers:
        raise ValueError(
            f"actor.lora.target_modules={settings.target_modules!r} matched no linear layer of "
            f"{type(model).__name__}; name its projections (e.g. [q_proj, v_proj]) or use all-linear"
        )
    return model


def fused_adapters(model: nn.Module) -> list[str]:
    """The names of `model`'s adapters on parameters rather than linear layers (PEFT's ParamWrapper): a
    mixture-of-experts model's fused expert tensors (`mlp.experts`: gate_up_proj [E, 2I, H] and down_proj
    [E, H, I]) and its routers' weights (`mlp.gate`), which PEFT adapts when target_modules is all-linear or
    names gate / up / down_proj."""
    from peft.tuners.lora.layer import ParamWrapper

    return sorted(name for name, layer in lora_layers(model).items() if isinstance(layer, ParamWrapper))


def _xavier_a(layers: dict[str, nn.Module]) -> None:
    """Each adapter's A redrawn xavier-uniform (the caller holds the seeded generator). An adapter on a fused
    tensor (PEFT's ParamWrapper: a mixture-of-experts model's experts, a router) stacks one A_e [r, in] per expert
    as [E r, in] (megatron/lora.py `expert_factors`); each A_e takes its own bound sqrt(6 / (in + r)), as
    megatron-bridge draws every expert's A, not the stack's sqrt(6 / (in + E r))."""
    from peft.tuners.lora.layer import ParamWrapper

    for layer in layers.values():
        a = layer.lora_A[ADAPTER].weight
        with torch.no_grad():
            if isinstance(layer, ParamWrapper):
                bound = math.sqrt(6 / (a.shape[1] + a.shape[0] // layer.num_experts))
                nn.init.uniform_(a, -bound, bound)
            else:
                nn.init.xavier_uniform_(a)


def in_model_name(saved: str) -> str:
    """A tensor's name in a PEFT adapter file as the injected model names it:
    `base_model.model.x.proj.lora_A.weight` -> `x.proj.lora_A.default.weight` (the inverse of `adapter_state`)."""
    name = saved.removeprefix("base_model.model.")
    name = re.sub(r"\.(lora_(?:A|B))\.", rf".\1.{ADAPTER}.", name)
    return re.sub(r"\.(lora_embedding_(?:A|B))$", rf".\1.{ADAPTER}", name)


@torch.no_grad()
def load_saved_adapter(model: nn.Module, settings: Any) -> None:
    """The adapter folder's weights (`actor.lora.adapter_path`) into the adapters `inject` put on `model` (real
    tensors: the rank that read the model). Every adapter must get a tensor of its shape, and every tensor
    an adapter; else an error naming the folder and the names. A no-op without an adapter folder."""
    from safetensors.torch import load_file

    folder = saved_adapter(settings)
    if folder is None:
        return
    saved = {
        in_model_name(name): tensor for name, tensor in load_file(str(Path(folder) / ADAPTER_WEIGHTS)).items()
    }
    adapters = {name: p for name, p in model.named_parameters() if ".lora_" in name}
    missing, unexpected = sorted(set(adapters) - set(saved)), sorted(set(saved) - set(adapters))
    wrong = [
        f"{name} {tuple(saved[name].shape)} (the model's {tuple(p.shape)})"
        for name, p in adapters.items()
        if name in saved and saved[name].shape != p.shape
    ]
    if missing or unexpected or wrong:
        raise ValueError(
            f"actor.lora.adapter_path={folder}: {ADAPTER_WEIGHTS} does not fit the adapters its {ADAPTER_CONFIG} "
            f"puts on {type(model).__name__} ({len(adapters)}): missing {missing[:3]}, not in the model "
            f"{unexpected[:3]}, other shapes {wrong[:3]}; was it saved from this base model ({ADAPTER_CONFIG}'s "
            "base_model_name_or_path)?"
        )
    for name, p in adapters.items():
        p.copy_(saved[name].to(p.dtype))


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """{module name: PEFT LoRA layer} of `model`."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def hf_name(name: str) -> str:
    """A parameter's name in the plain Hugging Face model: `x.proj.base_layer.weight` -> `x.proj.weight`, and
    `mlp.experts.base_layer.base_layer.gate_up_proj` -> `mlp.experts.gate_up_proj` (PEFT nests one ParamWrapper
    per adapted parameter of a module)."""
    return re.sub(r"(?:\.base_layer)+\.", ".", name)


def adapted_weights(model: nn.Module) -> dict[str, nn.Module]:
    """{Hugging Face name of an adapted weight: the LoRA layer that adapts it}: `x.proj.weight` for a linear,
    `mlp.experts.gate_up_proj` / `mlp.experts.down_proj` / `mlp.gate.weight` for PEFT's ParamWrappers."""
    return {
        f"{hf_name(name + '.')}{getattr(layer, 'parameter_name', 'weight')}": layer
        for name, layer in lora_layers(model).items()
    }


def delta_weight(layer: nn.Module, a: Tensor, b: Tensor, dtype: torch.dtype) -> Tensor:
    """(alpha / r) times the low-rank update of LoRA `layer`'s weight from its full A [r * E, in] and
    B [out, r * E], as PEFT computes it (peft/tuners/lora/layer.py, `Linear` / `ParamWrapper.get_delta_weight`):
    B A for a linear or a 2-D parameter; for E stacked experts, A's rows are E blocks of r (expert e: rows
    e r .. e r + r - 1) and B's columns r groups of E (expert e: columns e, E + e, ...), so expert e's update is
    B[:, e::E] A[e r : e r + r], laid out [E, out, in], or [E, in, out] where the tensor is stored that way
    (PEFT swaps in and out for a fused tensor unless its module says `is_transposed`)."""
    a, b = a.to(dtype), b.to(dtype)
    scale = layer.scaling[ADAPTER]
    experts = getattr(layer, "num_experts", 1)
    if getattr(layer, "_param_ndim", 2) == 2:
        return scale * (b @ a)
    a = a.reshape(experts, -1, a.shape[-1])  # [E, r, in]
    b = b.reshape(b.shape[0], -1, experts)  # [out, r, E]
    layout = "e o i" if layer._did_swap_in_out_features else "e i o"
    return scale * torch.einsum(f"o r e, e r i -> {layout}", b, a)


def merged_weights(
    named: Iterator[tuple[str, Tensor]], model: nn.Module, full: Callable[[Tensor], Tensor]
) -> Iterator[tuple[str, Tensor]]:
    """(Hugging Face name, tensor) with each adapter folded into its base weight; adapters not yielded.

    `named`: the model's (name, tensor) in order; `full(tensor)` makes a full local tensor of a (sharded)
    one and is called in the same order on every rank (a collective under FSDP2). A linear's weight becomes
    W + (alpha / r) B A; a mixture-of-experts model's fused expert tensors ([E, ...]) each expert's own update
    (`delta_weight`), which is what PEFT's merge_and_unload writes."""
    adapted = adapted_weights(model)
    for name, tensor in named:
        if ".lora_" in name:
            continue
        plain = hf_name(name)
        layer = adapted.get(plain) if ".base_layer." in name else None
        if layer is None:
            yield plain, full(tensor)
            continue
        a = full(layer.lora_A[ADAPTER].weight)
        b = full(layer.lora_B[ADAPTER].weight)
        weight = full(tensor)
        yield plain, weight + delta_weight(layer, a, b, weight.dtype)


def adapter_state(named: Iterator[tuple[str, Tensor]], full: Callable[[Tensor], Tensor]) -> dict[str, Tensor]:
    """The adapters as a PEFT adapter file names them (`base_model.model.<name>` without the adapter name)."""
    return {
        "base_model.model." + name.replace(f".{ADAPTER}.", "."): full(tensor)
        for name, tensor in named
        if ".lora_" in name
    }


def save_adapter(path: str | Path, settings: Any, state: dict[str, Tensor], base_model_path: str) -> Path:
    """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors) that PEFT loads onto the base."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = lora_config(settings).to_dict()
    config["base_model_name_or_path"] = str(base_model_path)
    config["task_type"] = "CAUSAL_LM"
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    (path / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, default=str) + "\n")
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path / ADAPTER_WEIGHTS))
    return path


@contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[None]:
    """The base model's forward while open: every LoRA layer bypassed."""
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class WithoutAdapter(TrainEngine):
    """An engine's model with its adapters off, as a frozen engine: the reference policy of a LoRA actor.

    Forwards run the actor engine's own sharded weights (no second model); its data-parallel layout, dtype,
    config and collectives are the actor's engine's, except offload / onload, which the actor's phases own.
    It trains nothing and has no weights of its own to read out or checkpoint: those are the actor's. `off`: what
    turns the engine's adapters off while open (by default PEFT's layers of `engine.model`; the megatron engine
    gives its own: engine/megatron/lora.py)."""

    def __init__(self, engine: TrainEngine, off: Callable[[], Any] | None = None) -> None:
        self._engine = engine
        self._off = off or (lambda: adapter_disabled(engine.model))  # type: ignore[attr-defined]

    @property
    def dp_rank(self) -> int:
        return self._engine.dp_rank

    @property
    def dp_size(self) -> int:
        return self._engine.dp_size

    @property
    def param_dtype(self) -> torch.dtype:
        return self._engine.param_dtype

    @property
    def config(self) -> Any:
        return self._engine.config

    @property
    def compile_seconds(self) -> float | None:
        return self._engine.compile_seconds

    def forward(self, batch: Any, fn: Any, micro_batch_size: int) -> Any:
        with self._off():
            return self._engine.forward(batch, fn, micro_batch_size)

    def train_step(self, batch: Any, loss_fn: Any, micro_batch_size: int) -> Any:
        raise RuntimeError(self._frozen("train_step"))

    def scheduler_step(self) -> float:
        raise RuntimeError(self._frozen("scheduler_step"))

    def all_reduce_sum(self, value: Tensor) -> Tensor:
        return self._engine.all_reduce_sum(value)

    def dispatch_info(self) -> tuple[int, int, bool]:
        return self._engine.dispatch_info()

    def state_dict_iter(self) -> Iterator[tuple[str, Tensor]]:
        raise NotImplementedError(self._frozen("state_dict_iter"))

    def state_dict_cuts(self, cuts_of: Any) -> Iterator[Any]:
        raise NotImplementedError(self._frozen("state_dict_cuts"))

    def adapter_state(self) -> dict[str, Tensor]:
        raise NotImplementedError(self._frozen("adapter_state"))

    def save_adapter(self, path: str | Path) -> int:
        raise NotImplementedError(self._frozen("save_adapter"))

    def without_adapter(self) -> TrainEngine:
        return self

    def save(self, path: str | Path) -> None:
        raise NotImplementedError(self._frozen("save"))

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        raise NotImplementedError(self._frozen("load"))

    def export_hf(self, path: str | Path) -> None:
        raise NotImplementedError(self._frozen("export_hf"))

    def offload(self) -> None:
        return None

    def onload(self) -> None:
        return None

    @staticmethod
    def _frozen(what: str) -> str:
        return (
            f"{what} on the LoRA actor's reference (the actor's engine with its adapters off, frozen): call it "
            "on the actor's engine"
        )

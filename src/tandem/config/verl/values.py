"""verl's values as Tandem's: the conversions the rules of config/verl/keys.py apply (a verl value in, the Tandem
value out; UnsupportedValue for a value Tandem has no meaning for)."""

from __future__ import annotations

import functools
from typing import Any

from tandem.config.verl.rules import UnsupportedValue
from tandem.config.yaml_io import parse_scalar


def compile_where_it_pays(value: Any) -> Any:
    # verl's default is true on any device; auto compiles where it pays and can (engine/lm_head.py compile_wanted)
    return "auto" if value is True else value


def as_list(value: Any) -> list:
    if isinstance(value, str):  # `all-linear`, `console`
        return [value]
    return list(value or [])


def rollout_engine(value: Any) -> str:
    if value in ("vllm", "hf"):
        return value
    if value == "sglang":
        return "auto"  # the note printed with it says what runs instead
    raise UnsupportedValue(f"Tandem's rollout engines are vllm and hf (Hugging Face generate), not {value!r}")


def strategy(value: Any) -> str:
    if value in ("fsdp", "fsdp2"):
        return "fsdp"  # Tandem's FSDP is FSDP2 (fully_shard) either way
    if value == "megatron":
        return "megatron"
    raise UnsupportedValue(f"Tandem's training strategies are fsdp (FSDP2) and megatron, not {value!r}")


def resume_mode(value: Any) -> str:
    if value in ("auto", "disable"):
        return value
    if value == "resume_path":  # read with trainer.resume_from_path (config/verl/translate.py)
        raise UnsupportedValue("it takes trainer.resume_from_path=PATH with it")
    raise UnsupportedValue(f"verl's resume modes are auto, disable and resume_path, not {value!r}")


def device(value: Any) -> str:
    if value in ("cuda", "cpu", "auto"):
        return value
    raise UnsupportedValue(f"Tandem runs on cuda or cpu (or auto), not {value!r}")


def profiler_tool(value: Any) -> tuple[str, bool]:
    """verl's global_profiler.tool as (trainer.profile.tool, trainer.profile.memory)."""
    tools = {"torch": ("torch", False), "torch_memory": ("torch", True), "nsys": ("nsys", False)}
    if value in tools:
        return tools[value]
    raise UnsupportedValue(
        f"Tandem profiles with torch.profiler or Nsight Systems (trainer.profile.*); it has no {value!r} hooks. "
        "Use global_profiler.tool=torch, torch_memory or nsys"
    )


def lr_warmup_steps(value: Any) -> int:
    return 0 if value is None or value < 0 else value


def hybrid_engine(value: Any) -> str:
    return "hybrid" if value in (True, "true", "True") else "separate"


def lr_decay_style(value: Any) -> str:
    """verl's megatron optimizer's schedule name (megatron-core's lr_decay_style) as actor.optim.lr_scheduler."""
    if value not in ("constant", "cosine", "linear"):
        raise UnsupportedValue(
            f"Tandem's schedules after warm-up are constant, cosine and linear, not {value!r}"
        )
    return value


def optimizer(value: Any) -> None:
    if str(value).lower() != "adamw":
        raise UnsupportedValue(f"Tandem's optimizer is AdamW, not {value!r}")


def verl_loggers(value: Any) -> list:
    """verl's trainer.logger as trainer.loggers: verl's `file` backend (a JSON line of metrics per step) is Tandem's
    `jsonl` (<run folder>/metrics.jsonl)."""
    names = ["jsonl" if name == "file" else name for name in as_list(value)]
    return list(dict.fromkeys(names))


# verl's names of a precision (verl/utils/torch_dtypes.py's PrecisionType lists) -> Tandem's dtype
_PRECISIONS = {
    **dict.fromkeys((16, "16", "fp16", "float16"), "float16"),
    **dict.fromkeys((32, "32", "fp32", "float32"), "float32"),
    **dict.fromkeys(("bf16", "bfloat16"), "bfloat16"),
}


def precision(value: Any) -> str:
    """One of verl's precision names (bf16, fp16, fp32, 16, 32, bfloat16, ...) as Tandem's dtype."""
    if value not in _PRECISIONS:
        raise UnsupportedValue(
            f"verl's precisions are bf16, fp16 and fp32 (or 16, 32, bfloat16, ...), not {value!r}"
        )
    return _PRECISIONS[value]


def float32_only(value: Any) -> str:
    if precision(value) != "float32":
        raise UnsupportedValue(
            "Tandem keeps a model's buffers (rotary frequencies, ...) in float32; set it fp32"
        )
    return "float32"


def master_dtype(value: Any) -> str:
    """verl's fsdp_config.model_dtype (the dtype the weights are loaded and kept in) as actor.fsdp.model_dtype."""
    dtype = precision(value)
    if dtype == "float16":
        raise UnsupportedValue(
            "Tandem keeps weights in fp32 or bf16; fp16 weights are not built (no loss scaling)"
        )
    return dtype


def float32_master(value: Any) -> str:
    """verl's fsdp_config.model_dtype (the dtype the weights are loaded and kept in): Tandem's are float32."""
    if precision(value) != "float32":
        raise UnsupportedValue(
            "Tandem keeps float32 master weights (and optimizer state); weights kept in "
            f"{precision(value)} are not built. The compute dtype is actor.fsdp.param_dtype"
        )
    return "float32"


def fsdp_mixed_precision(value: Any) -> dict[str, str]:
    """verl's FSDP mixed_precision ({param_dtype, reduce_dtype, buffer_dtype}: the SFT engine's, the PPO actor's
    fsdp_config) as actor.fsdp's dtypes."""
    value = hydra_mapping(value)
    if not isinstance(value, dict):
        raise UnsupportedValue("give a mapping: {param_dtype: bf16, reduce_dtype: fp32, buffer_dtype: fp32}")
    unknown = set(value) - {"param_dtype", "reduce_dtype", "buffer_dtype"}
    if unknown:
        raise UnsupportedValue(
            f"verl reads param_dtype, reduce_dtype and buffer_dtype, not {sorted(unknown)}"
        )
    float32_only(value.get("buffer_dtype", "fp32"))
    # verl's defaults where the mapping leaves one out: bf16 compute, fp32 reductions
    return {
        "param_dtype": precision(value.get("param_dtype", "bf16")),
        "reduce_dtype": precision(value.get("reduce_dtype", "fp32")),
    }


def hydra_mapping(value: Any) -> Any:
    """A mapping as Hydra reads it from a command line: YAML reads Hydra's `{param_dtype:bf16}` (no space after the
    colon) as {'param_dtype:bf16': None}; each such entry becomes {'param_dtype': 'bf16'}. Other values unchanged."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if item is None and isinstance(key, str) and ":" in key:
            key, _, text = key.partition(":")
            item = parse_scalar(text.strip())
        out[key] = item
    return out


def chat_template_kwargs(value: Any) -> dict[str, Any]:
    """verl's data.apply_chat_template_kwargs (the chat template's variables) as data.chat_template_kwargs: a
    mapping, as Hydra reads one from a command line; its names and values are checked with Tandem's key."""
    value = hydra_mapping(value)
    if not isinstance(value, dict):
        raise UnsupportedValue(
            f"give a mapping of the chat template's variables, e.g. {{enable_thinking: false}}, not {value!r}"
        )
    return value


def hydra_value(text: str) -> Any:
    """A command line's value as verl's Hydra reads it (`null` None, `False` False, `[a,b]` a list, `{a:1}` a dict,
    `1e-6` a float, quotes dropped); text Hydra's grammar does not take (`~/data`) stays the text."""
    from hydra.errors import HydraException

    try:
        return _overrides_parser().parse_override(f"key={text}").value()
    except HydraException:
        return text


@functools.cache
def _overrides_parser() -> Any:
    """Hydra's override parser, made once (it holds no state between parses)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def reward_manager_name(value: Any) -> str:
    """verl's reward manager name as reward.manager: its naive, dapo, gdpo and prime managers call the function once
    per sample, as Tandem's naive does; any other name is kept (batch; a class's name with
    reward_manager.source=importlib; anything else is refused by the reward checks, naming the choices)."""
    return "naive" if value in ("dapo", "gdpo", "prime") else str(value)

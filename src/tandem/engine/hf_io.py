"""Hugging Face folders in and out of the engines: configs, model construction, layer discovery, export.

Kept free of torch.distributed so that tests (and `tandem export`) can build exactly the model an
engine builds, unsharded, and compare with it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from tandem.models.model_type import VISION_LANGUAGE_TYPES, is_vision_language

# Files of a Hugging Face folder that hold weights or the model config: written by `save_pretrained`,
# never copied from the source folder. Everything else (tokenizer, chat template, generation config) is.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
MODEL_FILES = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


# Files that hold a tokenizer's vocabulary (tokenizer_config.json alone holds none).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
MAX_LISTED_FILES = 8  # files named in a message about a folder


def _listing(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    more = f", ... ({len(names)} in all)" if len(names) > MAX_LISTED_FILES else ""
    return ", ".join(names[:MAX_LISTED_FILES]) + more


def _folder_problem(folder: Path) -> str | None:
    if not folder.exists():
        return "the folder does not exist"
    if not folder.is_dir():
        return "this is a file, not a folder"
    if not any(folder.iterdir()):
        return "the folder is empty"
    return None


def error_summary(error: BaseException) -> str:
    """'Type: first line of the message': transformers' errors run to many lines of advice."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line}"


def model_folder_problem(path: str | Path) -> str | None:
    """What keeps `path` from being a Hugging Face model folder (None when nothing does): read from
    the file system and config.json alone, so it is cheap enough to run before any worker starts."""
    folder = Path(path).expanduser()
    problem = _folder_problem(folder)
    if problem is not None:
        return problem
    if not (folder / "config.json").is_file():
        return f"no config.json in it (it holds: {_listing(folder)})"
    weights = [p for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)]
    if not weights:
        return f"no weights in it: no *.safetensors or pytorch_model*.bin file (it holds: {_listing(folder)})"
    try:
        AutoConfig.from_pretrained(folder)
    except Exception as error:  # an unknown model_type, broken JSON, ...: transformers says which
        return f"transformers cannot read its config.json ({error_summary(error)})"
    return None


def tokenizer_folder_problem(path: str | Path) -> str | None:
    """What keeps `path` from holding a tokenizer (None when nothing does), from its file names."""
    folder = Path(path).expanduser()
    problem = _folder_problem(folder)
    if problem is not None:
        return problem
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return (
            f"no tokenizer files in it: none of {', '.join(TOKENIZER_FILES)} (it holds: {_listing(folder)})"
        )
    return None


def auto_class(head: str, config: PretrainedConfig | None = None) -> type:
    """The transformers Auto class of a head: a causal LM (an image-text-to-text model for a vision-language
    `config`), or a token classifier with one label."""
    if head == "lm":
        if config is not None and is_vision_language(config):
            from transformers import AutoModelForImageTextToText

            return AutoModelForImageTextToText
        return AutoModelForCausalLM
    if head == "value":
        return AutoModelForTokenClassification
    raise ValueError(f"head must be 'lm' or 'value', got {head!r}")


def load_config(
    model_path: str | Path, head: str, attn_implementation: str | None = None
) -> PretrainedConfig:
    """The folder's config; a "value" head gets num_labels=1 (a causal-LM folder works too).
    `attn_implementation`: transformers' attention kernel (None: transformers' default)."""
    auto_class(head)  # validates head
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    config = AutoConfig.from_pretrained(model_path, **extra)
    if head == "value":
        config.num_labels = 1
    return config


def config_problems(folders: dict[str, str], check: Callable[[PretrainedConfig], None]) -> list[str]:
    """`check(config)`'s ValueErrors for the model folders of `folders` (what to call each in a message -> the
    folder), each as "<key>=<folder>: <error>"; a folder without a config.json is passed over (it is reported
    where it is read) and a folder two keys share is checked once."""
    problems = []
    checked = set()
    for key, folder in folders.items():
        if not folder or not (Path(folder) / "config.json").is_file() or folder in checked:
            continue
        checked.add(folder)
        try:
            check(load_config(folder, "lm"))
        except ValueError as err:
            problems.append(f"{key}={folder}: {err}")
    return problems


def unloadable_folders(folders: dict[str, str]) -> list[str]:
    """The model folders of `folders` (what to call each -> the folder) that `auto_class` cannot load, read from
    config.json alone, as "<key>=<folder>: <why>": a kind transformers has no class of for the role's head (a
    critic's or reward model's key: a token classifier; else a causal LM, or an image-text model of
    VISION_LANGUAGE_TYPES), or a folder that names its own code (`auto_map`: Tandem passes no trust_remote_code).
    A folder without config.json is passed over (it is reported where it is read)."""
    from transformers.models.auto import modeling_auto

    heads = {
        "lm": ("causal LM", modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        "value": (
            "a token classifier (a critic's or reward model's head)",
            modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        ),
    }
    problems = []
    for key, folder in folders.items():
        path = Path(folder or "") / "config.json"
        if not folder or not path.is_file():
            continue
        config = json.loads(path.read_text())
        kind = config.get("model_type")
        head = "value" if key.startswith(("critic.", "reward.")) else "lm"
        what, names = heads[head]
        if "auto_map" in config:
            why = (
                f"its config.json names code of its own (auto_map, model_type {kind!r}), which Tandem does not run "
                "(no trust_remote_code); use a model transformers builds"
            )
        elif kind in names or (head == "lm" and kind in VISION_LANGUAGE_TYPES):
            continue
        elif kind in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
            why = (
                f"a {kind!r} vision-language model; the FSDP2 engine builds {', '.join(VISION_LANGUAGE_TYPES)} "
                "(as the policy)"
            )
        else:
            why = f"model_type {kind!r}: transformers has no {what} of this kind"
        problems.append(f"{key}={folder}: {why}")
    return problems


def disable_dropout(config: PretrainedConfig) -> None:
    """Set every dropout probability of the config (and its text config) to 0, in place.

    RL needs the same function for rollout, old log-probs and the update; dropout would make
    the importance ratio noisy even at the first step."""
    for cfg in {id(config): config, id(config.get_text_config()): config.get_text_config()}.values():
        for key, value in vars(cfg).items():
            if "dropout" in key and isinstance(value, float):
                setattr(cfg, key, 0.0)
        # Token-classification heads fall back to p=0.1 when classifier_dropout is None.
        cfg.classifier_dropout = 0.0


def zero_dropout_modules(model: nn.Module) -> None:
    """p=0 for every nn.Dropout: covers modules that ignore the config's dropout keys."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def load_pretrained(
    model_path: str | Path, config: PretrainedConfig, head: str, seed: int
) -> PreTrainedModel:
    """Real float32 weights from the folder on the CPU.

    Weights the folder lacks (a value head's `score` on a causal-LM folder) are initialised from
    `seed` alone, with the global RNG left untouched, so every run and rank gets the same head."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_class(head, config).from_pretrained(model_path, config=config, dtype=torch.float32)
    zero_dropout_modules(model)
    return model


def build_on_meta(config: PretrainedConfig, head: str) -> PreTrainedModel:
    """The same architecture with no storage (meta device): filled later from rank 0's weights."""
    with torch.device("meta"):
        model = auto_class(head, config).from_config(config, dtype=torch.float32)
    zero_dropout_modules(model)
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (one FSDP unit each): the `_no_split_modules` classes,
    else the children of the first ModuleList called `layers` / `h` / `blocks`."""
    no_split = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in no_split]
    if layers:
        return layers
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks"):
            return list(module)
    return []


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """transformers' own non-reentrant checkpointing of each decoder layer (active in train mode).

    It wraps no module, so parameter names stay the HF ones (unlike torch's checkpoint_wrapper)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def persistent_keys(model: nn.Module) -> list[str]:
    """Names of the model's `state_dict()` (parameters, including tied duplicates, and persistent
    buffers) without materialising anything; works on the meta device."""
    return list(model.state_dict(keep_vars=True).keys())


def copy_side_files(source: str | Path, target: str | Path) -> list[str]:
    """Copy the tokenizer, chat template, generation config, ... files of `source` into `target`."""
    copied = []
    for file in sorted(Path(source).iterdir()):
        if not file.is_file() or file.name in MODEL_FILES or file.name.endswith(WEIGHT_SUFFIXES):
            continue
        shutil.copy2(file, Path(target) / file.name)
        copied.append(file.name)
    return copied


def export_dtype(config: PretrainedConfig) -> torch.dtype:
    """The dtype the source folder declares (so a bf16 checkpoint exports as bf16); float32 if none."""
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def save_folder(
    model_class: type[PreTrainedModel],
    config: PretrainedConfig,
    state: dict[str, torch.Tensor],
    path: str | Path,
    *,
    dtype: torch.dtype,
    source_path: str | Path | None = None,
) -> Path:
    """Write `state` (HF names, CPU tensors already in `dtype`) as `model_class` with `config`,
    then the side files of `source_path`. Tied weights are re-tied, so their duplicates are not
    needed in `state`; any other missing weight is an error."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = model_class(config)
    # assign=True adopts the given tensors: no second copy of the model is allocated.
    result = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    still_meta = [name for name, p in model.named_parameters() if p.is_meta]
    if still_meta or result.unexpected_keys:
        raise ValueError(
            f"export to {path}: weights missing {still_meta[:5]} / unexpected {result.unexpected_keys[:5]} "
            f"for {model_class.__name__}"
        )
    model.config.dtype = dtype
    model.save_pretrained(path, safe_serialization=True)
    if source_path is not None:
        # After save_pretrained: the source's generation_config.json (sampling defaults) wins.
        copy_side_files(source_path, path)
    return path


def is_adapter_folder(path: str | Path) -> bool:
    """A PEFT adapter folder (adapter_config.json, no model of its own), as `tandem export` writes for LoRA."""
    folder = Path(path)
    return (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file()


def merge_adapter(adapter: str | Path, out: str | Path) -> Path:
    """A Hugging Face folder at `out`: the adapter folder's base model (its adapter_config.json's
    base_model_name_or_path, a local folder) with the adapters merged in, and the base's tokenizer files."""
    import json

    from peft import PeftModel

    adapter = Path(adapter)
    base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise ValueError(
            f"{adapter}: adapter_config.json names base_model_name_or_path={base!r}, not a local folder; "
            "set it to the base model's folder"
        )
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    copy_side_files(base, out)
    return Path(out)

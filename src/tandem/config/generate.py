"""`tandem generate`'s config: n samples per prompt of a parquet file, written out as verl's
`main_generation` writes them (the work is `commands/generate.py`).

Its keys are flat (`model_path=DIR n=4`); a dotted key (`data.n_samples=4`, `rollout.top_p=0.7`) is
one of verl's `main_generation` keys, translated by the table in `config/verl/generation_keys.py`. A
command line with verl's keys starts from verl's defaults (`VERL_GENERATION_DEFAULTS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from tandem.config.coerce import parse_into
from tandem.config.errors import ConfigError, Problems
from tandem.config.verl import (
    GENERATION_DEFAULTS,
    VERL_GENERATION_DEFAULTS,
    UnsupportedValue,
    VerlTranslation,
    accept_default,
    accept_old_default,
    apply_rule,
    generation_rule,
    removed_key_message,
)
from tandem.config.yaml_io import parse_scalar, read_yaml
from tandem.models.chat_template import template_kwargs_problems
from tandem.rollout_options import facts, named


@dataclass
class GenerateConfig:
    """What `tandem generate` does (every key can be set as `key=value`)."""

    model_path: str = ""  # a local Hugging Face folder (verl: model.path)
    tokenizer_path: str | None = None  # the tokenizer's folder; null = model_path
    data_path: str = ""  # a parquet (or jsonl) file of prompt rows (verl: data.path)
    prompt_key: str = "prompt"  # the column of chat messages (verl: data.prompt_key)
    output_path: str = ""  # the parquet written: the input's columns + `responses` (verl: data.output_path)
    n: int = 1  # samples per prompt (verl: data.n_samples)
    batch_size: int = 128  # prompts per engine call, and per resume part (verl: data.batch_size)
    max_prompt_length: int = 1024  # tokens, after the chat template (verl: rollout.prompt_length)
    max_response_length: int = 512  # tokens generated per sample at most (verl: rollout.response_length)
    truncation: Literal["error", "left", "right"] = (
        "error"  # a longer prompt: an error, or cut (right: its end)
    )
    chat_template: Literal["auto", "plain", "none"] = "auto"  # as data.chat_template of training
    # the chat template's variables, as data.chat_template_kwargs of training: chat_template_kwargs.enable_thinking=false
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    temperature: float = 1.0  # 0 = greedy (then n must be 1)
    top_p: float = 1.0  # 1 = off
    top_k: int = -1  # -1 = off
    seed: int = 0  # the same seed, model and prompts give the same samples (resumed or not)
    engine: Literal["auto", "vllm", "hf"] = "auto"  # auto: vLLM where installed, else Hugging Face generate
    device: Literal["auto", "cuda", "cpu"] = "auto"  # auto: cuda where there is a GPU
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = (
        "auto"  # auto: bfloat16 on cuda, float32 on cpu
    )
    # The engines (`generate_layout`): nnodes x workers_per_node devices (GPUs, or CPU processes on a CPU),
    # tensor_parallel of them per engine; more than one device runs one Ray actor per device
    nnodes: int = 1  # machines (verl: trainer.nnodes)
    workers_per_node: int = 1  # devices per machine (verl: trainer.n_gpus_per_node)
    tensor_parallel: int = 1  # devices per engine (vLLM; verl: rollout.tensor_model_parallel_size)
    replicas: int = 0  # engines side by side; 0 = nnodes x workers_per_node / tensor_parallel
    cpus_per_worker: float = 1.0  # CPUs Ray reserves per device's process (its torch threads)
    ray_address: str | None = None  # None = a local Ray of this run; auto = join `ray start`'s cluster
    gpu_memory_utilization: float = 0.5  # vLLM's share of GPU memory
    cpu_kv_cache_gib: int = 1  # vLLM's KV cache on a CPU
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # more vLLM engine arguments
    extra_columns: bool = True  # also write response_lengths (tokens) and finish_reasons (stop / length)
    overwrite: bool = False  # replace an existing output_path (else an error)
    progress_bar: bool = True  # a progress bar on a terminal (a line per batch otherwise)


_MAPPING_KEYS = ("engine_kwargs.", "chat_template_kwargs.")  # keys set one name at a time: KEY.NAME=VALUE


def generate_config_to_yaml(cfg: GenerateConfig) -> str:
    """YAML text of every key, which `tandem generate FILE` reads back into an equal config."""
    return yaml.safe_dump(asdict(cfg), sort_keys=False, default_flow_style=False)


def is_verl_generation_key(key: str) -> bool:
    """A dotted key is verl's: GenerateConfig's keys are flat but for engine_kwargs.* and chat_template_kwargs.*."""
    return "." in key and not key.startswith(_MAPPING_KEYS)


def translate_generation_overrides(overrides: Iterable[str]) -> VerlTranslation:
    """verl's main_generation `key=value` overrides as GenerateConfig's; Tandem's are kept as they are."""
    out = VerlTranslation()
    for text in map(str, overrides):
        key, sep, value_text = text.partition("=")
        key = key.strip().lstrip("+")
        if not sep or not is_verl_generation_key(key):
            out.overrides.append(text)
            continue
        rule = generation_rule(key)
        if rule is None:  # a key of an older verl release is accepted at its old default
            if not accept_old_default(out.no_effect, text, "generation"):
                out.problems.append(
                    (
                        key,
                        removed_key_message(key, "generation", value_text)
                        or f"{key}: a key verl's main_generation config (generation.yaml) does not have, or one "
                        "Tandem does not support (tandem/config/verl/generation_keys.py); tandem generate's own "
                        "keys are flat: model_path, data_path, n, ... (`tandem generate --help`)",
                    )
                )
            continue
        try:
            pairs = apply_rule(key, rule, value_text)
        except UnsupportedValue as err:
            old_default = accept_old_default(out.no_effect, text, "generation")
            if not old_default and not accept_default(out, text, GENERATION_DEFAULTS, rule.note or str(err)):
                out.problems.append((key, f"{key}={value_text.strip()}: {err}"))
            continue
        if pairs is None:
            out.no_effect.append((text.lstrip("+"), rule.note))
            continue
        out.overrides += [tandem_text for _, tandem_text in pairs]
        note = rule.note if key != "rollout.name" or value_text.strip() == "sglang" else ""
        out.mapped.append((text.lstrip("+"), " ".join(t for _, t in pairs), note))
    return out


def load_generate_config(
    file: str | Path | None = None,
    overrides: Iterable[str] = (),
    *,
    on_verl: Any = None,
) -> tuple[GenerateConfig, dict[str, str]]:
    """A checked GenerateConfig from an optional YAML `file` of its keys and `key=value` overrides (verl's
    main_generation keys among them: then verl's defaults are the base, and `on_verl(translation)` is called),
    and the verl key that set each config key (for messages that name the key the user wrote).
    Raises ConfigError naming every bad key (the verl key as written where one was translated)."""
    translation = translate_generation_overrides(overrides)
    if translation.problems:
        raise ConfigError([message for _, message in translation.problems])
    values: dict[str, Any] = {}
    if file is not None:
        tree = read_yaml(Path(file))
        if not isinstance(tree, Mapping):
            raise ConfigError(f"{file}: a tandem generate config is a mapping of its keys (model_path: ...)")
        values.update(tree)
    if translation.read_verl:  # verl's defaults where nothing else is given, in the printed command line too
        given = {text.partition("=")[0].strip() for text in translation.overrides} | set(values)
        defaults = [f"{key}={value}" for key, value in VERL_GENERATION_DEFAULTS.items() if key not in given]
        translation.overrides[:0] = defaults
    problems = Problems()
    written = verl_key_names(translation)
    for text in translation.overrides:
        key, sep, value_text = text.partition("=")
        if not sep:
            raise ConfigError(f"override {text!r} is not key=value")
        key = key.strip()
        if key.startswith(_MAPPING_KEYS):
            mapping, _, name = key.partition(".")
            values.setdefault(mapping, {})[name] = parse_scalar(value_text)
        else:
            values[key] = parse_scalar(value_text.strip())
        problems.notes[key] = f"from override '{_written_text(translation, key) or text}'"
    cfg = GenerateConfig()
    parse_into(cfg, values, "", problems, root=GenerateConfig)
    problems.raise_if_any()
    check_generate_config(cfg, written)
    if translation.read_verl and on_verl is not None:
        on_verl(translation)
    return cfg, written


def verl_key_names(translation: VerlTranslation) -> dict[str, str]:
    """GenerateConfig key -> the verl key that set it."""
    return {
        part.partition("=")[0]: verl_text.partition("=")[0]
        for verl_text, tandem_text, _ in translation.mapped
        for part in tandem_text.split(" ")
    }


def _written_text(translation: VerlTranslation, key: str) -> str | None:
    """The verl override (key=value) that set GenerateConfig key `key`, if one did."""
    for verl_text, tandem_text, _ in translation.mapped:
        if any(part.partition("=")[0] == key for part in tandem_text.split(" ")):
            return verl_text
    return None


def check_generate_config(cfg: GenerateConfig, verl_names: Mapping[str, str] | None = None) -> None:
    """Every rule the keys break, in one ConfigError; a key a verl override set is named as written."""
    verl_names = verl_names or {}

    def name(key: str) -> str:
        return verl_names.get(key, key)

    problems = []
    for key in ("model_path", "data_path", "output_path"):
        if not getattr(cfg, key):
            problems.append(f"{key} is not set: give {key}=PATH (verl's key: {_VERL_NAME[key]}=PATH)")
    for key in ("n", "batch_size", "max_prompt_length", "max_response_length"):
        if getattr(cfg, key) < 1:
            problems.append(f"{name(key)}={getattr(cfg, key)}: must be >= 1")
    if cfg.temperature < 0:
        problems.append(f"{name('temperature')}={cfg.temperature}: must be >= 0 (0 = greedy)")
    if cfg.temperature == 0 and cfg.n > 1:
        problems.append(
            f"{name('n')}={cfg.n} with {name('temperature')}=0: greedy decoding gives n identical samples; "
            "set n=1 or a temperature above 0"
        )
    if not 0 < cfg.top_p <= 1:
        problems.append(f"{name('top_p')}={cfg.top_p}: must be in (0, 1]")
    if cfg.top_k == 0 or cfg.top_k < -1:
        problems.append(f"{name('top_k')}={cfg.top_k}: must be >= 1, or -1 (off)")
    try:
        layout = generate_layout(cfg, verl_names)
        if named(cfg.engine) is not None:  # auto: checked once resolved (commands/generate.py)
            check_engine_layout(cfg.engine, layout, cfg.engine, verl_names)
    except ConfigError as err:
        problems += err.problems
    # the key as written: verl's data.apply_chat_template_kwargs where its keys set it
    kwargs_key = next(
        (
            verl.rpartition(".")[0]
            for key, verl in verl_names.items()
            if key.startswith("chat_template_kwargs.")
        ),
        name("chat_template_kwargs"),
    )
    problems += template_kwargs_problems(kwargs_key, cfg.chat_template_kwargs)
    if cfg.chat_template_kwargs and cfg.chat_template in ("plain", "none"):
        problems.append(
            f"{kwargs_key} {cfg.chat_template_kwargs} are variables of the tokenizer's chat "
            f"template, which chat_template={cfg.chat_template} does not use: set chat_template=auto, or drop them"
        )
    if cfg.data_path and cfg.output_path and Path(cfg.data_path).resolve() == Path(cfg.output_path).resolve():
        problems.append(
            f"{name('output_path')} is the input file {cfg.data_path}: write the output elsewhere"
        )
    if problems:
        raise ConfigError(problems)


@dataclass(frozen=True)
class GenerateLayout:
    """Where `tandem generate`'s engines run: `replicas` engines, each on `tensor_parallel` consecutive devices
    (ranks) of nnodes x workers_per_node; replica r holds ranks r x tensor_parallel ... (r + 1) x
    tensor_parallel - 1. One engine on one device (the default) runs in the command's own process; any other
    layout runs one Ray actor per device."""

    nnodes: int
    workers_per_node: int
    tensor_parallel: int
    replicas: int

    @property
    def devices(self) -> int:
        return self.nnodes * self.workers_per_node

    @property
    def in_process(self) -> bool:
        """One engine on one device: no Ray, as a single `tandem generate` has always run."""
        return self.devices == 1

    def describe(self, device: str) -> str:
        """e.g. "4 replicas x tensor_parallel 2 on 1 node x 8 cuda devices"."""
        engines = f"{self.replicas} replica{'s' if self.replicas != 1 else ''}"
        tp = f" x tensor_parallel {self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        nodes = f"{self.nnodes} node{'s' if self.nnodes != 1 else ''}"
        return f"{engines}{tp} on {nodes} x {self.workers_per_node} {device} device{'s' if self.devices > 1 else ''}"


def generate_layout(cfg: GenerateConfig, verl_names: Mapping[str, str] | None = None) -> GenerateLayout:
    """The engines' layout from nnodes, workers_per_node, tensor_parallel and replicas; raises ConfigError
    naming the keys (as the user wrote them) when the counts do not fit together.

    As verl: replicas = nnodes x workers_per_node / tensor_parallel. Where verl has no key for it, Tandem's
    `replicas=N` asks for N engines: nnodes x workers_per_node is then N x tensor_parallel devices, split
    evenly over the nodes (workers_per_node left at 1 is derived; another value must agree). An engine's
    devices are consecutive ranks, so an engine holds part of one node (tensor_parallel divides
    workers_per_node) or whole nodes (workers_per_node divides tensor_parallel), never parts of two."""
    names = verl_names or {}

    def name(key: str) -> str:
        return names.get(key, key)

    nnodes, per_node, tp, replicas = cfg.nnodes, cfg.workers_per_node, cfg.tensor_parallel, cfg.replicas
    bad = [
        f"{name(key)}={value}: must be >= {least}"
        for key, value, least in (
            ("nnodes", nnodes, 1),
            ("workers_per_node", per_node, 1),
            ("tensor_parallel", tp, 1),
            ("replicas", replicas, 0),
        )
        if value < least
    ]
    if cfg.cpus_per_worker <= 0:
        bad.append(f"{name('cpus_per_worker')}={cfg.cpus_per_worker}: must be > 0")
    if bad:
        raise ConfigError(bad)
    devices = nnodes * per_node
    if replicas:
        wanted = replicas * tp
        if per_node == 1 and wanted != devices:  # derive workers_per_node from replicas
            if wanted % nnodes:
                raise ConfigError(
                    f"replicas={replicas} x {name('tensor_parallel')}={tp} = {wanted} devices do not split "
                    f"evenly over {name('nnodes')}={nnodes} nodes: make replicas x tensor_parallel a multiple "
                    "of nnodes"
                )
            per_node, devices = wanted // nnodes, wanted
        elif wanted != devices:
            raise ConfigError(
                f"replicas={replicas} x {name('tensor_parallel')}={tp} = {wanted} devices, but "
                f"{name('nnodes')}={nnodes} x {name('workers_per_node')}={per_node} = {devices}: give replicas "
                "alone (workers_per_node follows), or nnodes and workers_per_node alone (replicas = devices / "
                "tensor_parallel)"
            )
    elif devices % tp:
        raise ConfigError(
            f"{name('nnodes')}={nnodes} x {name('workers_per_node')}={per_node} = {devices} devices do not "
            f"split into engines of {name('tensor_parallel')}={tp} devices: make {name('nnodes')} x "
            f"{name('workers_per_node')} a multiple of {name('tensor_parallel')}, or give replicas=N "
            "(workers_per_node follows)"
        )
    if per_node % tp and tp % per_node:
        raise ConfigError(
            f"{name('tensor_parallel')}={tp} with {name('workers_per_node')}={per_node} devices per node: an "
            "engine would hold part of one node and part of the next; make tensor_parallel divide "
            "workers_per_node, or a multiple of it (an engine on whole nodes)"
        )
    return GenerateLayout(nnodes, per_node, tp, devices // tp)


def check_engine_layout(
    engine: str, layout: GenerateLayout, asked: str = "auto", verl_names: Mapping[str, str] | None = None
) -> None:
    """Refuse a tensor-parallel layout for an engine that cannot split a model (its facts: Hugging Face generate
    holds the whole model on each device; `engine`: the engine resolved, `asked`: the engine key as given)."""
    if not facts(engine).tensor_parallel and layout.tensor_parallel > 1:
        names = verl_names or {}
        chosen = (
            f"engine={engine}"
            if asked == engine
            else f"engine={asked}, which is {engine} where vLLM is not installed"
        )
        raise ConfigError(
            f"{names.get('tensor_parallel', 'tensor_parallel')}={layout.tensor_parallel} needs the vLLM engine "
            f"({chosen}): Hugging Face generate holds the whole model on one device; install vLLM and use "
            "engine=vllm, or tensor_parallel=1 (one replica per device)"
        )


_VERL_NAME = {"model_path": "model.path", "data_path": "data.path", "output_path": "data.output_path"}

"""verl's keys read as Tandem's: command-line overrides and whole verl YAML trees, translated.

`translate_overrides` turns a verl command line (`actor_rollout_ref.model.path=...`) into Tandem
overrides (`actor.model_path=...`) and records every key it read: mapped (verl key -> Tandem key),
accepted with no effect (and why), or a problem (a verl key Tandem has no meaning for). Keys Tandem
shares with verl, and keys of neither, pass through untouched for the loader to check.
`translate_tree` does the same for a verl config tree (`config/verl/hydra_yaml.py` composes one from a
verl YAML and its `defaults:`), where a key Tandem has no meaning for is dropped and named instead.
The table of keys is `config/verl/keys.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.config.coerce import type_at
from tandem.config.verl.defaults import RL_DEFAULTS, SFT_DEFAULTS
from tandem.config.verl.dist_checkpoint import DIST_KEYS, read_dist_checkpoint
from tandem.config.verl.engine_keys import (
    STRATEGY_KEY,
    ignored_message,
    ignored_note,
    reading_engine,
    run_engine,
)
from tandem.config.verl.hints import unknown_verl_key_message
from tandem.config.verl.keys import SGLANG_NOTE, VERL_KEYS, is_verl_key, verl_rule
from tandem.config.verl.removed import Trainer, old_defaults, removed_key, removed_note
from tandem.config.verl.rules import Rule, UnsupportedValue
from tandem.config.verl.sft_keys import SFT_KEYS, SFT_ONLY_PREFIXES, sft_rule_key
from tandem.config.verl.values import hydra_value
from tandem.config.yaml_io import dotted_leaves, is_true, parse_scalar
from tandem.train_engine_options import facts as train_engine

# keys of a verl YAML not read: verl writes its own default there, which would not suit Tandem
_TREE_DROPS = {
    "trainer.device": "verl's YAML always says cuda; Tandem's verl preset has auto (cuda where there is a GPU)",
}

# verl's older sizes over all GPUs: verl divides each by its data-parallel size (the GPUs over the role's Ulysses
# size, the verl key named here; None: 1) when it builds the worker, and Tandem does the same (_per_gpu), then
# applies the `_per_gpu` key's rule (Tandem's sizes are per rank, as verl's `_per_gpu` keys are)
GLOBAL_MICRO_BATCH_KEYS = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "critic.ppo_micro_batch_size": "critic.ulysses_sequence_parallel_size",
    "critic.forward_micro_batch_size": "critic.ulysses_sequence_parallel_size",
    "reward_model.micro_batch_size": None,
}

# Tandem keys several verl keys map to, combined with `or` (verl's param and optimizer offload)
_ANY_OF = {"actor.fsdp.cpu_offload"}


@dataclass
class VerlTranslation:
    """What reading verl's keys did: the Tandem overrides, and a line for every verl key read."""

    overrides: list[str] = field(default_factory=list)  # in Tandem's keys, in the given order
    mapped: list[tuple[str, str, str]] = field(default_factory=list)  # (verl text, Tandem text, note)
    no_effect: list[tuple[str, str]] = field(default_factory=list)  # (verl text, why)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (verl text, why): tree keys only
    problems: list[tuple[str, str]] = field(default_factory=list)  # (verl key, message)
    # (verl text, Tandem key, value): a verl size that must equal the resolved Tandem key's (the reference's
    # and critic's megatron layout is the actor's); checked by load_config against the resolved config
    same: list[tuple[str, str, Any]] = field(default_factory=list)
    tree_keys: int = 0  # keys of a verl YAML read as Tandem's

    source: str = ""  # the verl YAML file a tree translation came from

    def merge(self, other: VerlTranslation) -> None:
        """The command line's translation (`other`) after a verl YAML's (this one): `overrides` become
        the command line's (the YAML's are applied before them)."""
        self.overrides = other.overrides
        self.mapped += other.mapped
        self.no_effect += other.no_effect
        self.problems += other.problems
        self.same += other.same

    @property
    def read_verl(self) -> bool:
        return bool(self.source or self.mapped or self.no_effect or self.problems)

    def summary(self, command: str = "tandem train verl") -> str:
        """The printed translation: each verl key -> Tandem key, the keys with no effect and why, and
        the same run as a Tandem command line."""
        lines = []
        if self.source:
            lines.append(
                f"tandem: read verl config {self.source} with its defaults: {_count(self.tree_keys, 'key')} as Tandem's, "
                f"{len(self.dropped)} with no Tandem setting dropped (`tandem config --from-verl "
                f"{self.source}` writes the Tandem YAML and names each dropped key)"
            )
        if self.mapped or self.no_effect:
            lines.append(
                f"tandem: read {_count(len(self.mapped) + len(self.no_effect), 'verl key')} as Tandem's"
            )
        width = min(max((len(v) for v, _, _ in self.mapped), default=0), 64)
        for verl, tandem, note in self.mapped:
            lines.append(f"  {verl:<{width}}  ->  {tandem}" + (f"   ({note})" if note else ""))
        if self.no_effect:
            lines.append("  accepted with no effect in Tandem:")
            lines += [f"    {verl}: {why}" for verl, why in self.no_effect]
        if not self.source:
            lines.append("  the same run in Tandem's keys:")
            lines.append("    " + " ".join([command, *(_shell_quote(o) for o in self.overrides)]))
        return "\n".join(lines)


def translate_overrides(
    overrides: Iterable[str], *, sft: bool = False, sizes: Mapping[str, str] | None = None
) -> VerlTranslation:
    """verl's `key=value` overrides as Tandem's; other overrides are kept as they are. `sft`: the keys are
    those of verl's SFT trainers (`model.partial_pretrain`, `optim.lr`, ...: config/verl/sft_keys.py).
    `sizes`: the settings verl reads together with others (GPU counts, Ulysses sizes, resume mode; see
    `verl_sizes`) as the whole config gives them, over those of `overrides` alone."""
    out = VerlTranslation()
    combined: dict[str, int] = {}  # _ANY_OF key -> its index in out.overrides
    filter_overlong = False  # verl's data.filter_overlong_prompts wins over data.truncation
    overrides = [str(o) for o in overrides]
    # the GPU counts and Ulysses sizes verl's older global micro-batch keys are divided by
    sizes = {**verl_sizes(None, overrides), **(sizes or {})}
    engine = (
        None if sft else run_engine(sizes)
    )  # the verl engine whose own LoRA keys are read (engine_keys.py)
    for text in overrides:
        key, sep, value_text = text.partition("=")
        key = key.strip().lstrip("+")
        if sep and None in _defaults(sft).get(key, ()) and hydra_value(value_text.strip()) is None:
            out.no_effect.append((text.lstrip("+"), "null: verl's default, not set; Tandem's default stays"))
            continue  # verl's `null` is "not set", as in a YAML (translate_tree); keys Tandem shares too
        if not sep or key.startswith("~") or not _reads_as_verl(key, sft):
            out.overrides.append(text)
            continue
        reader = reading_engine(key)
        if engine is not None and reader is not None and reader != engine:
            if at_verl_default(key, value_text.strip(), _defaults(sft)):
                out.no_effect.append((text.lstrip("+"), ignored_note(reader, engine)))
            else:
                out.problems.append((key, ignored_message(key, value_text.strip(), reader, engine)))
            continue  # verl's other engine's key (config/verl/engine_keys.py)
        if key in ("trainer.resume_mode", "trainer.resume_from_path") and not sft:
            _resume(out, text, sizes)
            continue
        if key in DIST_KEYS and not sft:  # a role's switch and folder, read together
            read_dist_checkpoint(out, text, sizes)
            continue
        try:
            if key in GLOBAL_MICRO_BATCH_KEYS and not sft:  # read as its `_per_gpu` key, as verl reads it
                key, value_text = _per_gpu(key, value_text, sizes)
            # verl's token budget is per GPU of a Ulysses group; Tandem's counts the whole rows
            budget = parse_scalar(value_text.strip()) if key == _ACTOR_TOKENS and not sft else None
            if isinstance(budget, int):
                value_text = str(budget * _ulysses(sizes))
        except (UnsupportedValue, TypeError, ValueError) as err:
            if not accept_default(out, text, _defaults(sft)):
                out.problems.append((key, f"{key}={value_text.strip()}: {err}"))
            continue
        rule = _rule(key, sft)
        if rule is None:  # a key of an older verl release is accepted at its old default
            if not accept_old_default(out.no_effect, text, "sft" if sft else "ppo"):
                out.problems.append((key, unknown_verl_key_message(key, sft, value_text)))
            continue
        try:
            pairs = apply_rule(key, rule, value_text)
        except UnsupportedValue as err:
            old_default = accept_old_default(out.no_effect, text, "sft" if sft else "ppo")
            if not old_default and not accept_default(out, text, _defaults(sft), rule.note or str(err)):
                out.problems.append((key, f"{key}={value_text.strip()}: {err}"))
            continue
        if rule.effect == "same":
            value = parse_scalar(pairs[0][1].partition("=")[2]) if pairs else None
            out.same.append((text.lstrip("+"), rule.target, value))
            out.mapped.append((text.lstrip("+"), f"(the same as {rule.target})", rule.note))
            continue
        if pairs is None:
            out.no_effect.append((text.lstrip("+"), rule.note))
            continue
        if key == "data.filter_overlong_prompts":  # applied after the loop, over any data.truncation
            filter_overlong = pairs[0][1] == "data.truncation=filter"
            out.mapped.append((text.lstrip("+"), pairs[0][1] if filter_overlong else "(nothing)", rule.note))
            continue
        for target, tandem_text in pairs:
            if target in _ANY_OF and target in combined:  # the second of param / optimizer offload
                i = combined[target]
                previous = out.overrides[i].partition("=")[2]
                if is_true(tandem_text.partition("=")[2]) or not is_true(previous):
                    out.overrides[i] = tandem_text
                continue
            if target in _ANY_OF:
                combined[target] = len(out.overrides)
            out.overrides.append(tandem_text)
        note = SGLANG_NOTE if key.endswith("rollout.name") and value_text.strip() == "sglang" else rule.note
        out.mapped.append((text.lstrip("+"), " ".join(t for _, t in pairs), note))
    if filter_overlong:
        out.overrides = [o for o in out.overrides if not o.startswith("data.truncation=")]
        out.overrides.append("data.truncation=filter")
    return out


def at_verl_default(key: str, value_text: str, defaults: Mapping[str, Sequence[Any]]) -> bool:
    """Whether `key=value_text` gives verl's own default value of `key` (`defaults`: a table of
    config/verl/defaults.py or removed.py, the configs of the trainer the command line is for), the value read as Hydra reads
    it (`null`, `False`, `[a,b]`, `1e-6`)."""
    if key not in defaults:
        return False
    value = hydra_value(value_text)
    return any(_same_value(value, default) for default in defaults[key])


def _defaults(sft: bool) -> Mapping[str, Sequence[Any]]:
    return SFT_DEFAULTS if sft else RL_DEFAULTS


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def accept_default(
    out: VerlTranslation, text: str, defaults: Mapping[str, Sequence[Any]], why: str = ""
) -> bool:
    """A verl key given at verl's default value (`defaults`, see at_verl_default) is accepted as if absent (what
    verl does then is what Tandem does), with a note; True when it was. Any other value keeps its refusal."""
    key, _, value_text = text.partition("=")
    key = key.strip().lstrip("+")
    if not at_verl_default(key, value_text.strip(), defaults):
        return False
    note = "verl's default, the same as leaving it out"
    out.no_effect.append((text.lstrip("+"), f"{note} ({why})" if why else note))
    return True


def accept_old_default(notes: list[tuple[str, str]], text: str, trainer: Trainer) -> bool:
    """A key verl removed since a release of the last year (config/verl/removed.py) given at a default it had there:
    accepted as if absent, with a note added to `notes`; True when it was. Other values are the caller's."""
    key, _, value_text = text.lstrip("+").partition("=")
    if not at_verl_default(key.strip(), value_text.strip(), old_defaults(trainer)):
        return False
    notes.append((text.lstrip("+"), removed_note(key.strip(), trainer)))
    return True


def verl_sizes(tree: Mapping[str, Any] | None, overrides: Iterable[str] = ()) -> dict[str, str]:
    """The settings verl reads other keys by (trainer.nnodes / n_gpus_per_node and the Ulysses sizes that divide
    the older global micro-batch keys, the resume mode), as text: those of a composed verl config `tree`,
    with the command line's `overrides` over them, as Hydra applies them."""
    sizes = {
        key: _override_text(value)
        for key, value in dotted_leaves(tree or {})
        if key in _SIZES and value is not None and "${" not in str(value)  # unresolved: not set
    }
    for key, _, value in (str(o).partition("=") for o in overrides):
        if key.strip().lstrip("+") in _SIZES:
            sizes[key.strip().lstrip("+")] = value
    return sizes


def translate_tree(
    tree: Mapping[str, Any], *, sft: bool = False, sizes: Mapping[str, str] | None = None
) -> VerlTranslation:
    """A composed verl config tree as Tandem overrides. A null value (verl: not set) keeps Tandem's
    default; a key Tandem has no meaning for is dropped and named, not an error: a verl YAML holds
    every verl default, most of them for parts Tandem does not have. `sizes`: as for translate_overrides
    (the command line's GPU counts over the tree's)."""
    out = VerlTranslation()
    texts: list[str] = []
    for key, value in dotted_leaves(tree):
        if key.endswith("._target_") or key == "_target_" or key.startswith("hydra."):
            continue
        shown = f"{key}: {_override_text(value)}"
        if key in _TREE_DROPS:
            out.dropped.append((shown, _TREE_DROPS[key]))
            continue
        if value is None or (isinstance(value, str) and "${" in value):
            continue  # verl's "not set" (or an interpolation verl_yaml could not resolve)
        if not _reads_as_verl(key, sft):
            if is_tandem_key(key):
                texts.append(f"{key}={_override_text(value)}")
            else:
                out.dropped.append((shown, "Tandem has no setting for it"))
            continue
        rule = _rule(key, sft)
        if rule is None and removed_key(key, "sft" if sft else "ppo"):  # at its old default, else refused
            if not accept_old_default(out.dropped, f"{key}={_override_text(value)}", "sft" if sft else "ppo"):
                out.problems.append((key, unknown_verl_key_message(key, sft, _override_text(value))))
        elif rule is None:
            out.dropped.append((shown, "Tandem has no setting for it"))
        elif rule.effect not in ("maps", "same"):
            out.dropped.append((shown, rule.note))
        else:
            texts.append(f"{key}={_override_text(value)}")
    translated = translate_overrides(texts, sft=sft, sizes=sizes)
    out.overrides, out.tree_keys = translated.overrides, len(translated.overrides)
    # a file's reference / critic megatron size (verl's YAML gives the critic its own, 1 by default): Tandem builds
    # those roles with the actor's layout, which computes the same values (verl's layout changes memory and
    # speed); a size the command line gives that differs is refused (layout_problems)
    out.dropped += [
        (
            f"{text}",
            f"the {'critic' if text.startswith('critic.') else 'reference'} is built with the actor's "
            f"megatron layout ({target}): the same values, another memory use",
        )
        for text, target, _ in translated.same
    ]
    out.dropped += [(f"{k}", message) for k, message in translated.problems]
    out.dropped += [(verl, why) for verl, why in translated.no_effect]
    return out


# --- helpers ------------------------------------------------------------------------------------

# verl multiplies the actor's token budget by its Ulysses size (each GPU of a group holds 1/size of a row's
# tokens); Tandem's actor.max_tokens_per_micro_batch counts the whole rows of a micro-batch
_ACTOR_TOKENS = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
_ULYSSES = (
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
)


def _ulysses(given: Mapping[str, str]) -> int:
    """The actor's Ulysses size a command line gives (the last of verl's two keys for it; 1 when neither)."""
    sizes = [int(parse_scalar(given[k])) for k in _ULYSSES if k in given]
    return sizes[-1] if sizes else 1


_SIZES = {
    STRATEGY_KEY,  # which of verl's engines reads its engine-only keys (config/verl/engine_keys.py)
    *_ULYSSES,
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "trainer.resume_mode",
    "trainer.resume_from_path",
    *DIST_KEYS,
    *filter(None, GLOBAL_MICRO_BATCH_KEYS.values()),
}


def _resume(out: VerlTranslation, text: str, given: Mapping[str, str]) -> None:
    """verl's trainer.resume_mode / resume_from_path read together, as verl reads them: the path is used only
    with resume_mode=resume_path (auto, verl's default, resumes from the run folder's latest checkpoint)."""
    key, _, value = (part.strip() for part in text.lstrip("+").partition("="))
    mode = str(parse_scalar(given.get("trainer.resume_mode", "auto")))
    path = given.get("trainer.resume_from_path", "").strip()
    if key == "trainer.resume_from_path":
        if mode == "resume_path" and path not in ("", "null"):
            out.overrides.append(f"trainer.resume={value}")
            out.mapped.append(
                (text.lstrip("+"), f"trainer.resume={value}", "with trainer.resume_mode=resume_path")
            )
        else:
            out.no_effect.append(
                (text.lstrip("+"), f"verl reads it only with trainer.resume_mode=resume_path (here: {mode})")
            )
    elif value == "resume_path":
        if path in ("", "null"):
            out.problems.append(
                (
                    key,
                    f"{key}=resume_path needs trainer.resume_from_path=PATH, the checkpoint folder to resume from",
                )
            )
        else:
            out.mapped.append((text.lstrip("+"), "(trainer.resume: trainer.resume_from_path)", ""))
    else:
        try:
            pairs = apply_rule(key, VERL_KEYS[key], value)
        except UnsupportedValue as err:
            out.problems.append((key, f"{key}={value}: {err}"))
            return
        out.overrides += [t for _, t in pairs or []]
        out.mapped.append((text.lstrip("+"), " ".join(t for _, t in pairs or []), ""))


def _per_gpu(key: str, value_text: str, sizes: Mapping[str, str]) -> tuple[str, str]:
    """verl's older micro-batch size over all GPUs as its `_per_gpu` key: divided by the data-parallel size
    (nnodes x n_gpus_per_node, verl's defaults 1 and 8, over the role's Ulysses size), as verl's workers divide it."""
    try:
        gpus = int(parse_scalar(sizes.get("trainer.nnodes", "1"))) * int(
            parse_scalar(sizes.get("trainer.n_gpus_per_node", "8"))
        )
        ulysses = GLOBAL_MICRO_BATCH_KEYS[key]
        ulysses_size = int(parse_scalar(sizes.get(ulysses, "1"))) if ulysses else 1
        data_parallel = max(gpus // ulysses_size, 1)
        size = int(parse_scalar(value_text.strip()))
    except (TypeError, ValueError) as err:
        raise UnsupportedValue(f"cannot read it or the GPU counts as numbers ({err})") from None
    if size // data_parallel < 1:
        raise UnsupportedValue(
            f"verl counts it over all GPUs: {size} over {data_parallel} data-parallel GPUs is 0 per GPU; "
            f"give the size on one GPU: {key}_per_gpu"
        )
    return f"{key}_per_gpu", str(size // data_parallel)


def is_tandem_key(dotted: str) -> bool:
    """Whether `dotted` names a key (a field, or a section) of Tandem's schema."""
    return type_at(dotted) is not None


def _reads_as_verl(key: str, sft: bool = False) -> bool:
    """verl's meaning applies: a key in the verl table, or under a verl-only section. A key Tandem
    has with the same meaning (data.train_batch_size, algorithm.gamma, ...) is Tandem's."""
    if sft and (key in SFT_KEYS or key.startswith(SFT_ONLY_PREFIXES)):
        return True
    older = removed_key(key, "sft" if sft else "ppo") is not None  # a key of verl's releases of the last year
    return key in VERL_KEYS or ((is_verl_key(key) or older) and not is_tandem_key(key))


def _rule(key: str, sft: bool) -> Rule | None:
    """The rule of verl key `key`; an SFT key without a rule of its own takes that of its RL name."""
    if sft:
        rule, rl_key = sft_rule_key(key)
        if rule is not None or rl_key:
            return rule or verl_rule(rl_key, is_tandem_key)
    return verl_rule(key, is_tandem_key)


def is_verl_sft_key(key: str) -> bool:
    """A key only verl's SFT configs have (`model.partial_pretrain`, `optim.lr`, ...): a verl SFT command line.
    A key verl's PPO trainer reads as well (`trainer.logger`) says nothing of which trainer it is."""
    sft_only = key.startswith(SFT_ONLY_PREFIXES) or (key in SFT_KEYS and not is_verl_key(key))
    return sft_only and not is_tandem_key(key)


def apply_rule(key: str, rule: Rule, value_text: str) -> list[tuple[str, str]] | None:
    """The Tandem (key, `key=value` text) pairs a verl override becomes; None for a key with no effect.
    Raises UnsupportedValue for a key or value Tandem has no meaning for."""
    if rule.effect == "unsupported":
        raise UnsupportedValue(f"Tandem has no meaning for verl's {key}: {rule.note}")
    if rule.effect == "none":
        return None
    if rule.effect == "same" and rule.convert is None:
        return [(rule.target, f"{rule.target}={value_text.strip()}")]
    value_text = value_text.strip()
    if rule.convert is not None:
        parsed = hydra_value(value_text)  # as verl's Hydra reads it: {a:b} a mapping, 1e-6 a number
        try:
            value = rule.convert(parsed)
        except UnsupportedValue:
            raise
        except (TypeError, ValueError) as err:
            raise UnsupportedValue(f"cannot read {parsed!r} as verl's value for it ({err})") from None
        value_text = _override_text(value)
    if not rule.target:  # a value checked (e.g. optim.optimizer=AdamW), nothing to set
        return None
    if rule.effect == "same":
        return [(rule.target, f"{rule.target}={value_text}")]
    targets = rule.target.split(",")
    if rule.convert is not None and isinstance(value, tuple) and len(value) == len(targets) > 1:
        return [
            (t, f"{t}={_override_text(v)}") for t, v in zip(targets, value, strict=True)
        ]  # one value each
    return [(target, f"{target}={value_text}") for target in targets]


def _override_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _count(n: int, noun: str) -> str:
    """`1 verl key`, `2 verl keys`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _shell_quote(text: str) -> str:
    if any(c in text for c in " \"'[]{}$*?;&|<>()"):
        return "'" + text.replace("'", "'\\''") + "'"
    return text


def layout_problems(translation: VerlTranslation, cfg: Any) -> list[tuple[str, str]]:
    """(verl key, message) for each reference / critic megatron size of `translation` that differs from the
    actor's in the resolved config `cfg` (read only when the actor's engine reads that section, actor.megatron,
    and only for a role the run builds: a GRPO run without KL has neither)."""
    section = f"actor.{train_engine(cfg.actor.strategy).section}."
    out = []
    # cfg.derived's critic_needed / reference_needed, read from their keys: derived waits for the other checks
    critic_built = cfg.critic.enable is True
    reference_built = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    for verl_text, target, value in translation.same:
        key = verl_text.partition("=")[0]
        if not target.startswith(section):
            continue  # the settings of an engine the run does not build
        if not (critic_built if key.startswith("critic.") else reference_built):
            continue  # a role the run does not build: its layout is never read, as on verl
        actual: Any = cfg
        for part in target.split("."):
            actual = getattr(actual, part)
        if value != actual:
            role = "critic" if key.startswith("critic.") else "reference"
            out.append(
                (
                    key,
                    f"{key}={value} differs from the actor's {target}={actual}: Tandem builds the {role} with the "
                    "actor's megatron layout (the engines of one process share megatron's parallel state). "
                    f"Set it to {actual}, or drop it",
                )
            )
    return out

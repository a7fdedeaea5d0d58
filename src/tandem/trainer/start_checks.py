"""Start-up checks of what the config points at, run in the trainers' constructors before any worker
starts: the engines this install has and what they run with yet (check_available), the model and
tokenizer folders and what their architectures allow, the tokenizer on the run's own prompts, every
row's ground truth against the scorer of its data_source, and the agent loop's tool and interaction files
with the rows' verl fields for them (tools_kwargs, interaction_kwargs, agent_name). A problem is an error naming the key, folder,
file, row or field (exit status 2 through the CLI); a tokenizer that changes the text is a warning.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tandem.config.errors import ConfigError
from tandem.config.modes import rollout_tensor_parallel_problems
from tandem.config.schema import TandemConfig
from tandem.data.rows import DataError, tokenize
from tandem.engine import check_buildable
from tandem.engine.hf_io import (
    TOKENIZER_FILES,
    error_summary,
    model_folder_problem,
    tokenizer_folder_problem,
)
from tandem.models.model_type import VISION_LANGUAGE_TYPES, folder_model_type
from tandem.rewards.registry import UnknownDataSourceError
from tandem.rollout import LATER_ENGINES, resolve_engine
from tandem.rollout.agent import ChatInserter, interaction_from_config, toolset_from_config
from tandem.rollout.base import read_special_ids
from tandem.rollout.vllm_models import engine_kwargs_problems, model_problems, text_config
from tandem.tools import InteractionRouter, StatefulTool
from tandem.tools.names import TOOL_AGENT

logger = logging.getLogger(__name__)

GROUND_TRUTH_FIELD = "reward_model.ground_truth"
MAX_LISTED_ROWS = 5  # rows named in a ground-truth error
EXCERPT_CHARS = 80  # characters of a prompt shown around the first place a round trip changed it


def actor_tokenizer_source(cfg: TandemConfig) -> tuple[str, str]:
    """(key, folder) of the actor's tokenizer: actor.tokenizer_path, else actor.model_path."""
    a = cfg.actor
    return (
        ("actor.tokenizer_path", a.tokenizer_path) if a.tokenizer_path else ("actor.model_path", a.model_path)
    )


def load_tokenizer(path: str, key: str = "actor.model_path") -> Any:
    """The tokenizer in folder `path` (named by config key `key`); a folder transformers cannot read
    a tokenizer from is a ConfigError naming the key and the folder."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as error:  # transformers' own words: a missing sentencepiece, a broken JSON, ...
        raise ConfigError(
            f"{key}={path}: transformers cannot load a tokenizer from this folder ({error_summary(error)}); "
            f"point {key} at a folder with the model's tokenizer files "
            f"({', '.join(TOKENIZER_FILES)} and tokenizer_config.json)"
        ) from error


def load_actor_tokenizer(cfg: TandemConfig) -> Any:
    """The actor's tokenizer (actor.tokenizer_path, else actor.model_path): the prompts', rollout's and SFT's."""
    key, folder = actor_tokenizer_source(cfg)
    return load_tokenizer(folder, key)


def load_image_processor(cfg: TandemConfig) -> Any:
    """A vision-language actor's processor (its image processor and tokenizer, from actor.model_path), which
    widens each image of a prompt to its tokens; None for a text model."""
    if folder_model_type(cfg.actor.model_path) not in VISION_LANGUAGE_TYPES:
        return None
    from transformers import AutoProcessor

    from tandem.models.without_torchvision import adapt_transformers

    adapt_transformers()
    return AutoProcessor.from_pretrained(cfg.actor.model_path)


# --- folders -------------------------------------------------------------------------------------------


def _role_folders(cfg: TandemConfig, purpose: str) -> list[tuple[str, str, str, bool]]:
    """(role, key, folder, is_model) of every folder a run of `purpose` reads, model folders first."""
    a, c, rm = cfg.actor, cfg.critic, cfg.reward.reward_model
    tokenizer_key, tokenizer_path = actor_tokenizer_source(cfg)
    folders = [("actor", "actor.model_path", a.model_path, True)]
    if purpose == "rl" and cfg.derived.critic_needed:
        folders.append(("critic", "critic.model_path", c.model_path, True))
    if purpose == "rl" and cfg.derived.reward_model_needed:
        folders.append(("reward model", "reward.reward_model.model_path", rm.model_path, True))
    folders.append(("actor", tokenizer_key, tokenizer_path, False))
    # The critic and the reward model read the actor's token ids: their tokenizers are only compared
    # with the actor's (role_tokenizer_warnings), so only one named explicitly must be there.
    if (
        purpose == "rl"
        and cfg.derived.critic_needed
        and c.tokenizer_path
        and c.tokenizer_path != a.tokenizer_path
    ):
        folders.append(("critic", "critic.tokenizer_path", c.tokenizer_path, False))
    if purpose == "rl" and cfg.derived.reward_model_needed and rm.tokenizer_path:
        folders.append(("reward model", "reward.reward_model.tokenizer_path", rm.tokenizer_path, False))
    return [f for f in folders if f[2]]


def check_model_folders(cfg: TandemConfig, purpose: str = "rl") -> None:
    """Every model folder a run of `purpose` (rl, eval, sft) loads must hold config.json and weights,
    and the actor's tokenizer folder tokenizer files; else a ConfigError listing each key and folder."""
    problems, bad_folders = [], set()
    for role, key, folder, is_model in _role_folders(cfg, purpose):
        if folder in bad_folders:
            continue  # one message per folder
        if is_model:
            problem = model_folder_problem(folder)
            fix = (
                f"point {key} at a local Hugging Face folder of the {role} (config.json, weights, tokenizer)"
            )
        else:
            problem = tokenizer_folder_problem(folder)
            fix = (
                "put the model's tokenizer files there, or set actor.tokenizer_path to the folder that holds them"
                if key == "actor.model_path"
                else f"point {key} at a folder holding the tokenizer files, or leave it unset"
            )
        if problem is not None:
            bad_folders.add(folder)
            problems.append(f"{key}={folder}: {problem}; {fix}")
    if problems:
        raise ConfigError(problems)


# --- engines and model architectures -----------------------------------------------------------------


def check_available(cfg: TandemConfig, purpose: str = "rl") -> None:
    """Engines the config may name but this release does not have yet: an error before any worker starts.
    `purpose`: "rl", or "sft" (no rollout, no critic)."""
    problems = []
    if cfg.rollout.engine in LATER_ENGINES:
        problems.append(f"rollout.engine={cfg.rollout.engine} is not available yet; use vllm or hf")
    if cfg.rollout.engine == "vllm" and resolve_engine("auto") != "vllm":
        problems.append("rollout.engine=vllm but vllm is not installed; see README (Installing) or use hf")
    if cfg.rollout.tensor_parallel > 1:
        problems += rollout_tensor_parallel_problems(cfg)
    if resolve_engine(cfg.rollout.engine) == "vllm" and purpose != "sft":
        problems += vllm_problems(cfg)
    lora = cfg.actor.lora
    if lora.syncs_adapters and resolve_engine(cfg.rollout.engine) != "vllm":
        problems.append(
            "actor.lora.rollout_sync=adapter needs vLLM's LoRA support, and vllm is not installed (the rollout "
            "engine resolves to hf); use actor.lora.rollout_sync=merged"
        )
    problems += model_override_problems(cfg, purpose)
    settings = cfg.actor.megatron if cfg.actor.strategy == "megatron" else cfg.actor.fsdp
    problems += check_buildable(cfg.actor.strategy, settings, engine_model_folders(cfg))
    problems += dist_checkpoint_problems(cfg, purpose)
    model_type = folder_model_type(cfg.actor.model_path)
    if model_type in VISION_LANGUAGE_TYPES:
        problems += vision_language_problems(cfg, model_type, purpose)
    if problems:
        raise ConfigError("\n".join(problems))


def dist_checkpoint_problems(cfg: TandemConfig, purpose: str = "rl") -> list[str]:
    """The megatron distributed checkpoints the run starts from are folders megatron wrote (its metadata.json);
    whether they hold the model's weights is checked as each engine loads them (engine/megatron/dist_start.py)."""
    if cfg.actor.strategy != "megatron":
        return []
    folders = {"actor.megatron.dist_checkpoint": cfg.actor.megatron.dist_checkpoint}
    if purpose != "sft" and cfg.derived.critic_needed:
        folders["critic.megatron_dist_checkpoint"] = cfg.critic.megatron_dist_checkpoint
    problems = []
    for key, folder in folders.items():
        if folder and not (Path(folder).expanduser() / "metadata.json").is_file():
            what = "no such folder" if not Path(folder).expanduser().is_dir() else "no metadata.json in it"
            problems.append(
                f"{key}={folder}: not a megatron distributed checkpoint ({what}); `tandem convert hf-to-mcore "
                "MODEL_DIR OUT_DIR` writes one from a Hugging Face folder"
            )
    return problems


# attention kernels that run on CUDA only (engine/attention.py `resolve` says the same in the worker)
CUDA_ATTENTION = ("flash_attention_2", "varlen")


def model_override_problems(cfg: TandemConfig, purpose: str = "rl") -> list[str]:
    """What keeps the model config overrides (actor.override_config for the actor, reference and rollout;
    critic.override_config) and the roles' attention kernels from being built as asked: megatron builds from
    config.json alone, and a CUDA-only kernel on trainer.device=cpu."""
    problems = []
    sections = {"actor": cfg.actor.override_config}
    if purpose != "sft" and cfg.critic.override_config:
        sections["critic"] = cfg.critic.override_config
    for role, overrides in sections.items():
        if overrides and cfg.actor.strategy == "megatron":
            problems.append(
                f"{role}.override_config is applied by the FSDP2 engine (actor.strategy=fsdp); megatron's own is "
                "actor.megatron.override_transformer_config (or edit the model folder's config.json)"
            )
        if "attn_implementation" in overrides:
            problems.append(
                f"{role}.override_config.attn_implementation: the attention kernel is "
                f"{'actor.fsdp' if role == 'actor' else 'critic'}.attn_implementation; set it there"
            )
    kernels = {"actor.fsdp.attn_implementation": cfg.actor.fsdp.attn_implementation}
    if purpose != "sft":
        kernels["critic.attn_implementation"] = cfg.critic.attn_implementation
    for key, kernel in kernels.items():
        if cfg.trainer.device == "cpu" and kernel in CUDA_ATTENTION:
            problems.append(
                f"{key}={kernel} runs on CUDA only and trainer.device=cpu; set {key}=sdpa (or sdpa_split, eager)"
            )
    return problems


def vllm_problems(cfg: TandemConfig) -> list[str]:
    """What vLLM would refuse later, after the workers started: engine arguments Tandem sets itself, and the
    actor's model folder as vLLM reads it (a missing router field; on trainer.device=cpu, what vLLM's CPU
    kernels take); the fix for the model's is rollout.engine=hf."""
    problems = engine_kwargs_problems(cfg.rollout.engine_kwargs)
    device = "cpu" if cfg.trainer.device == "cpu" else None  # auto: the engine checks once it knows
    config = text_config(cfg.actor.model_path, cfg.actor.override_config) if cfg.actor.model_path else None
    model = model_problems(config, device)
    length = cfg.data.max_prompt_length + cfg.data.max_response_length  # the engine's max_model_len
    positions = (config or {}).get("max_position_embeddings")
    rope = (config or {}).get("rope_scaling") or {}
    if positions is not None and rope.get("rope_type", rope.get("type")) not in (None, "default", "llama3"):
        positions *= rope.get("factor", 1)  # vLLM's derived length of a scaled RoPE (yarn, dynamic, linear)
    if positions is not None and length > positions:
        model.append(
            f"data.max_prompt_length + data.max_response_length = {length} is more than its "
            f"max_position_embeddings={positions}, and vLLM refuses a longer max_model_len: lower them (or, where "
            "the model's positions reach further, raise max_position_embeddings in config.json)"
        )
    return problems + [f"actor.model_path={cfg.actor.model_path} for vLLM: {problem}" for problem in model]


def vision_language_problems(cfg: TandemConfig, model_type: str, purpose: str = "rl") -> list[str]:
    """What a vision-language actor does not run with yet (README, 'Vision-language models'); SFT asks only
    about the training engine."""
    a, r = cfg.actor, cfg.rollout
    what = f"actor.model_path is a vision-language model ({model_type})"
    problems = []
    if a.strategy != "fsdp":
        problems.append(f"{what}: train it with actor.strategy=fsdp")
    if a.fsdp.sequence_parallel > 1:
        problems.append(f"{what}: not yet with actor.fsdp.sequence_parallel > 1")
    if purpose == "sft":
        return problems
    if resolve_engine(r.engine) != "vllm" or r.mode != "sync" or r.layout != "hybrid":
        problems.append(
            f"{what}: its images are rolled out by vLLM's batched generate (rollout.engine=vllm, "
            "rollout.mode=sync, rollout.layout=hybrid)"
        )
    if cfg.derived.critic_needed or cfg.derived.reward_model_needed:
        problems.append(
            f"{what}: no critic or reward model reads images yet; use a critic-free estimator (grpo, "
            "rloo, ...) and rule-based rewards"
        )
    return problems


def engine_model_folders(cfg: TandemConfig) -> dict[str, str]:
    """The model folders the actor's engine strategy builds, by key: the actor's, and the critic's and the reward
    model's when the run has them (what `engine.check_buildable` reads)."""
    folders = {"actor.model_path": cfg.actor.model_path}
    if cfg.derived.critic_needed:
        folders["critic.model_path"] = cfg.critic.model_path
    if cfg.derived.reward_model_needed:
        folders["reward.reward_model.model_path"] = cfg.reward.reward_model.model_path
    return folders


# --- tokenizers ----------------------------------------------------------------------------------------


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _excerpt(text: str, at: int) -> str:
    start = max(0, at - EXCERPT_CHARS // 4)
    piece = text[start : start + EXCERPT_CHARS]
    return ("..." if start else "") + repr(piece) + ("..." if start + EXCERPT_CHARS < len(text) else "")


def round_trip_warning(
    tokenizer: Any, samples: Iterable[tuple[str, str]], key: str, folder: str
) -> str | None:
    """A warning when decoding the token ids of a sample text does not give the text back (the model
    would train on other text than the data holds), with the first such sample; None when all do."""
    samples = list(samples)
    if not samples:
        return None
    ids = tokenize(tokenizer, [text for _, text in samples])
    changed = 0
    first = None
    for (location, text), row in zip(samples, ids):
        decoded = _decode(tokenizer, row)
        if unicodedata.normalize("NFC", decoded) != unicodedata.normalize("NFC", text):
            changed += 1
            first = first or (location, text, decoded)
    if first is None:
        return None
    location, text, decoded = first
    at = next((i for i, (x, y) in enumerate(zip(text, decoded)) if x != y), min(len(text), len(decoded)))
    return (
        f"the tokenizer of {key}={folder} ({type(tokenizer).__name__}) does not give back the text it "
        f"encodes ({changed} of the first {len(samples)} prompts change): {location} is {_excerpt(text, at)} "
        f"but decodes as {_excerpt(decoded, at)} (first difference at character {at}). The model would see "
        "other text than the data holds. transformers may have picked the tokenizer class from config.json's "
        "model type rather than the folder's tokenizer: set actor.tokenizer_path to a folder holding only "
        "the tokenizer files (tokenizer.json, tokenizer_config.json, ...)"
    )


def role_tokenizer_warnings(
    cfg: TandemConfig, tokenizer: Any, samples: Sequence[tuple[str, str]]
) -> list[str]:
    """Warnings for a critic or reward model whose tokenizer encodes the sample texts into other ids
    than the actor's: both read the actor's token ids as they are."""
    c, rm = cfg.critic, cfg.reward.reward_model
    actor_folder = actor_tokenizer_source(cfg)[1]
    roles = []
    if cfg.derived.critic_needed:
        roles.append(("critic", "critic.tokenizer_path", c.tokenizer_path, c.model_path))
    if cfg.derived.reward_model_needed:
        roles.append(("reward model", "reward.reward_model.tokenizer_path", rm.tokenizer_path, rm.model_path))
    texts = [text for _, text in samples]
    warnings = []
    for role, key, explicit, model_path in roles:
        folder = explicit or model_path
        if not folder or folder == actor_folder or not texts:
            continue
        if not explicit and tokenizer_folder_problem(folder) is not None:
            continue  # no tokenizer of its own to compare (none is needed)
        other = load_tokenizer(folder, key if explicit else key.replace("tokenizer_path", "model_path"))
        if tokenize(other, texts) != tokenize(tokenizer, texts):
            warnings.append(
                f"the {role}'s tokenizer ({folder}) encodes the data's prompts into other token ids than "
                f"the actor's ({actor_folder}); the {role} reads the actor's token ids as they are, so it "
                f"would see other text. Use a {role} trained with the actor's tokenizer, or set {key} to "
                "the actor's tokenizer folder if the tokenizer in its model folder is not the right one"
            )
    return warnings


def check_tokenizers(cfg: TandemConfig, tokenizer: Any, datasets: Iterable[Any], purpose: str = "rl") -> None:
    """Log a warning when the actor's tokenizer does not round-trip the first rows of each dataset (as
    rendered for the model), or a critic's / reward model's tokenizer encodes them differently."""
    key, folder = actor_tokenizer_source(cfg)
    samples = [sample for data in datasets if data is not None for sample in data.sample_texts]
    warnings = [round_trip_warning(tokenizer, samples, key, folder)]
    if purpose == "rl":
        warnings += role_tokenizer_warnings(cfg, tokenizer, samples)
    for warning in warnings:
        if warning is not None:
            logger.warning("%s", warning)


# --- ground truth --------------------------------------------------------------------------------------


def _found(data: Any, i: int, value: Any) -> str:
    if value is None:
        return f"the row has no {GROUND_TRUTH_FIELD}" if i in data.ground_truth_absent else "it is null"
    return f"found {value!r:.80} ({type(value).__name__})"


def check_ground_truths(rewards: Any, datasets: Iterable[Any]) -> None:
    """Every row's ground truth must suit the scorer of its data_source (the scorer's declared check,
    see tandem/rewards/registry.py); else a DataError naming the file, row and field of each bad row."""
    problems = []
    for data in datasets:
        if data is None:
            continue
        rows = []
        for i in range(len(data)):
            item = data[i]
            style = item["extra_info"].get("style")
            rows.append(
                (item["data_source"], style if isinstance(style, str) else None, item["ground_truth"])
            )
        for i, scorer, problem in rewards.ground_truth_problems(rows):
            data_source, _, value = rows[i]
            problems.append(
                f"{data.locations[i]}: field '{GROUND_TRUTH_FIELD}' (data_source '{data_source}', scored by "
                f"{scorer}): {problem}; {_found(data, i, value)}"
            )
    if not problems:
        return
    listed = "\n".join(f"  - {p}" for p in problems[:MAX_LISTED_ROWS])
    more = f"\n  ... and {len(problems) - MAX_LISTED_ROWS} more" if len(problems) > MAX_LISTED_ROWS else ""
    raise DataError(
        f"{len(problems)} row(s) hold a ground truth their scorer cannot use (each would score 0 on every "
        f"sample):\n{listed}{more}\nFix the rows' {GROUND_TRUTH_FIELD}, or give the data_source a scorer that "
        "reads it (reward.custom_reward_file)"
    )


def check_item_data_sources(rewards: Any, datasets: Iterable[Any]) -> None:
    """Every row's data_source has a scorer, naming the first row of each that has none. For rows a user's
    dataset class made (data.custom_dataset_file): rows read from files are checked from the files before they
    are read (config/checks/data_sources.py)."""
    first: dict[tuple[Any, str | None], str] = {}
    for data in datasets:
        for i in range(len(data) if data is not None else 0):
            style = data[i]["extra_info"].get("style")
            key = (data[i]["data_source"], style if isinstance(style, str) else None)
            first.setdefault(key, data.locations[i])
    problems = []
    for source, location in first.items():
        try:
            rewards.check_data_sources([source])
        except UnknownDataSourceError as error:
            problems.append(f"{location}: {error.args[0]}")
    if problems:
        raise UnknownDataSourceError("\n".join(problems))


# --- the agent loop's files and the rows' fields for them ---------------------------------------------


def check_multi_turn(cfg: TandemConfig, datasets: Iterable[Any], tokenizer: Any = None) -> None:
    """Load rollout.multi_turn's tool and interaction files here, before any worker starts (a file that
    cannot be used is a ConfigError naming it, its line and the fix), check that the chat template of the
    actor's `tokenizer` (None: not checked) ends a turn where the agent loop can insert messages
    (check_chat_template_stops), then check the rows' verl fields for them: an interaction name no interaction
    has is a DataError naming the rows; tools_kwargs, interaction_kwargs or agent_name that this config would
    not use are a warning each."""
    m = cfg.rollout.multi_turn
    tools = toolset_from_config(m)
    interaction = interaction_from_config(m)
    agent = cfg.rollout.mode == "async"
    inserts = tools is not None or (interaction is not None and m.max_user_turns > 0)
    if agent and inserts and tokenizer is not None:
        check_chat_template_stops(cfg, tokenizer, tools)
    stateful = {t for t in (tools.names if tools is not None else []) if isinstance(tools[t], StatefulTool)}
    notes: dict[str, list[str]] = {}  # warning -> rows (locations)
    problems = []
    for data in datasets:
        if data is None:
            continue
        for i in range(len(data)):
            item, location = data[i], data.locations[i]
            for note in _row_notes(item, agent, tools, stateful, interaction):
                notes.setdefault(note, []).append(location)
            problem = _interaction_name_problem(item, interaction)
            if problem is not None:
                problems.append(f"{location}: {problem}")
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems[:MAX_LISTED_ROWS])
        more = (
            f"\n  ... and {len(problems) - MAX_LISTED_ROWS} more" if len(problems) > MAX_LISTED_ROWS else ""
        )
        raise DataError(
            f"{len(problems)} row(s) name an interaction rollout.multi_turn.interaction_file lacks:\n{listed}{more}"
        )
    for note, locations in notes.items():
        logger.warning("%s (%d rows, first %s)", note, len(locations), locations[0])


def check_chat_template_stops(cfg: TandemConfig, tokenizer: Any, tools: Any) -> None:
    """The agent loop inserts tool results and user turns after a model turn's stop token, where the chat
    template puts them (rollout/agent.py's ChatInserter), so the template must end an assistant turn with one of
    the rollout's stop ids (rollout/base.py's read_special_ids); else a ConfigError naming the tokenizer, its
    folder, the stop ids and the fix. The worker makes the same check; here it comes before any worker starts."""
    key, folder = actor_tokenizer_source(cfg)
    stop_ids, _ = read_special_ids(cfg.actor.model_path, cfg.actor.tokenizer_path, tokenizer)
    schemas = tools.schemas() if tools is not None and len(tools) else None
    try:
        ChatInserter(tokenizer, stop_ids, schemas, cfg.data.chat_template_kwargs)
    # ValueError: no stop token; transformers' / jinja's own: no template, or a broken one
    except Exception as error:
        raise ConfigError(
            f"rollout.mode=async with tools or a simulated user (rollout.multi_turn): the chat template of {key}="
            f"{folder} ({type(tokenizer).__name__}), with the stop ids {stop_ids} of actor.model_path="
            f"{cfg.actor.model_path}: {error_summary(error) if not isinstance(error, ValueError) else error}; "
            "or give the tokenizer a chat template whose assistant turn ends with one of the stop tokens "
            "(tokenizer_config.json's chat_template, or another tokenizer folder in actor.tokenizer_path)"
        ) from None


def _row_notes(
    item: dict[str, Any], agent: bool, tools: Any, stateful: set[str], interaction: Any
) -> list[str]:
    """What this config would not do with a row's verl fields for the agent loop, one line each."""
    extra = item["extra_info"]
    notes = []
    tools_kwargs = extra.get("tools_kwargs")
    if tools_kwargs and not (agent and tools is not None):
        notes.append(
            "extra_info.tools_kwargs: no tool reads them (they go to the tools of rollout.multi_turn.tool_file "
            "with rollout.mode=async); reward functions still see them in extra_info"
        )
    elif isinstance(tools_kwargs, dict):
        for name in sorted(set(tools_kwargs) - stateful):
            why = (
                "no tool has this name"
                if name not in tools
                else "it has no state (only verl-style tools read them)"
            )
            notes.append(f"extra_info.tools_kwargs['{name}']: not read, {why}")
    if extra.get("need_tools_kwargs") and not tools_kwargs:
        notes.append(
            "extra_info.need_tools_kwargs is true but tools_kwargs is empty: the tools get no create_kwargs"
        )
    if extra.get("interaction_kwargs") and not (agent and interaction is not None):
        notes.append(
            "extra_info.interaction_kwargs: no interaction reads them (set rollout.multi_turn.interaction_file "
            "and rollout.mode=async); reward functions still see them in extra_info"
        )
    if item.get("agent_name") == TOOL_AGENT and not agent:
        notes.append(
            "agent_name=tool_agent: rollout.mode=sync generates one turn without tools; set rollout.mode=async "
            "and rollout.multi_turn.tool_file to run verl's tool agent loop"
        )
    return notes


def _interaction_name_problem(item: dict[str, Any], interaction: Any) -> str | None:
    kwargs = item["extra_info"].get("interaction_kwargs")
    if not isinstance(interaction, InteractionRouter) or not isinstance(kwargs, dict):
        return None
    try:
        interaction.pick(kwargs)
    except ValueError as error:
        return str(error)
    return None

"""The tokenizers a run loads at start-up and what they do to the run's own prompts: the actor's tokenizer
(actor.tokenizer_path, else actor.model_path) and a vision-language actor's processor; a tokenizer that does not
give back the text it encodes, or a critic's / reward model's that encodes it into other ids than the actor's,
is a warning naming the key and folder."""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.data.rows import tokenize
from tandem.engine.hf_io import TOKENIZER_FILES, error_summary, tokenizer_folder_problem
from tandem.models.model_type import VISION_LANGUAGE_TYPES, folder_model_type

logger = logging.getLogger(__name__)
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

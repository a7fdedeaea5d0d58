"""verl's `main_generation` keys (`verl/trainer/config/generation.yaml`) and what each means for
`tandem generate`: the table `config/generate.py` reads.

Each key maps to a key of `GenerateConfig` (its value converted where the two differ), has no effect
(with the reason), or is unsupported (with what to do instead), as in `config/verl/keys.py`. The
defaults a verl command line starts from are verl's (`VERL_GENERATION_DEFAULTS`), so that a verl script
gets verl's numbers.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from tandem.config.verl.rules import Rule, UnsupportedValue, maps, no_effect, unsupported
from tandem.config.verl.values import chat_template_kwargs

# generation.yaml's values, in GenerateConfig's keys (its other keys are GPU-engine settings with no effect)
VERL_GENERATION_DEFAULTS: dict[str, Any] = {
    "n": 5,
    "batch_size": 128,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 0.7,
    "max_prompt_length": 1536,
    "max_response_length": 512,
    # verl's tokenizer call cuts a long prompt (truncation=True); Tandem's "right" cut keeps the chat
    # template's generation prompt at its end, and the cut rows are named in a warning
    "truncation": "right",
    "gpu_memory_utilization": 0.5,
}

_ENGINE_ARG = "a vLLM engine argument Tandem sets itself or leaves at vLLM's default (rollout.engine_kwargs)"
_NO_TRAINING = "generation builds no training engine"


def _engine(value: Any) -> str:
    if value in ("vllm", "hf"):
        return value
    if value == "sglang":
        return "auto"  # vLLM where installed: the note in the translation says so
    raise UnsupportedValue(f"Tandem's rollout engines are vllm and hf (Hugging Face generate), not {value!r}")


def _top_k(value: Any) -> int:
    return -1 if value in (0, -1, None) else value  # verl's hf rollout means "off" by 0, its vLLM one by -1


def _do_sample(value: Any) -> None:
    if value in (False, "false", "False"):
        raise UnsupportedValue("greedy decoding is rollout.temperature=0 (with data.n_samples=1)")


def _ignore_eos(value: Any) -> None:
    if value in (True, "true", "True"):
        raise UnsupportedValue("Tandem always stops a response at the model's end-of-sequence token")


def _one_sample(value: Any) -> None:
    if value not in (1, None):
        raise UnsupportedValue("the samples per prompt are data.n_samples; leave rollout.n at 1")


def _dtype(value: Any) -> str:
    if value in ("bfloat16", "bf16"):
        return "bfloat16"
    if value in ("float16", "fp16", "half"):
        return "float16"
    if value in ("float32", "fp32", "float"):
        return "float32"
    if value == "auto":
        return "auto"
    raise UnsupportedValue(f"the rollout dtypes are bfloat16, float16 and float32, not {value!r}")


GENERATION_KEYS: dict[str, Rule] = {
    "data.path": maps("data_path"),
    "data.prompt_key": maps("prompt_key"),
    "data.n_samples": maps("n"),
    "data.output_path": maps("output_path"),
    "data.batch_size": maps("batch_size"),
    "data.trust_remote_code": no_effect("Tandem loads tokenizers with transformers' own classes"),
    "data.apply_chat_template_kwargs": maps(
        "chat_template_kwargs", "the chat template's variables, as in training", chat_template_kwargs
    ),
    "model.path": maps("model_path"),
    "model.tokenizer_path": maps("tokenizer_path"),
    "model.trust_remote_code": no_effect("Tandem builds models with transformers' own classes"),
    "model.external_lib": unsupported("Tandem loads models with transformers only"),
    "model.use_shm": no_effect("Tandem reads the model folder from disk"),
    "rollout.name": maps(
        "engine",
        "sglang: Tandem has no SGLang engine yet; engine=auto runs vLLM (Hugging Face generate where vLLM "
        "is not installed) with the same sampling settings",
        convert=_engine,
    ),
    "rollout.mode": no_effect("tandem generate runs the engine's batched generate"),
    "rollout.temperature": maps("temperature"),
    "rollout.top_k": maps("top_k", "0 and -1 are off", convert=_top_k),
    "rollout.top_p": maps("top_p"),
    "rollout.prompt_length": maps("max_prompt_length"),
    "rollout.response_length": maps("max_response_length"),
    "rollout.dtype": maps("dtype", convert=_dtype),
    "rollout.gpu_memory_utilization": maps("gpu_memory_utilization"),
    "rollout.tensor_model_parallel_size": maps("tensor_parallel"),
    "rollout.do_sample": maps("", "sampling follows rollout.temperature (0 = greedy)", convert=_do_sample),
    "rollout.ignore_eos": maps("", "false: responses stop at the end-of-sequence token", convert=_ignore_eos),
    "rollout.n": maps("", "the samples per prompt are data.n_samples", convert=_one_sample),
    "rollout.calculate_log_probs": no_effect("the output holds texts, as verl's does"),
    "rollout.log_prob_micro_batch_size": no_effect("generation computes no log-prob pass"),
    "rollout.log_prob_micro_batch_size_per_gpu": no_effect("generation computes no log-prob pass"),
    "rollout.free_cache_engine": no_effect("the engine lives for the one generation"),
    "rollout.load_format": no_effect("the engine loads the model folder's weights"),
    "rollout.enforce_eager": no_effect(_ENGINE_ARG),
    "rollout.data_parallel_size": no_effect(_ENGINE_ARG),
    "rollout.max_num_batched_tokens": no_effect(_ENGINE_ARG),
    "rollout.max_model_len": no_effect(_ENGINE_ARG),
    "rollout.max_num_seqs": no_effect(_ENGINE_ARG),
    "rollout.disable_log_stats": no_effect(_ENGINE_ARG),
    "rollout.enable_chunked_prefill": no_effect(_ENGINE_ARG),
    "rollout.enable_prefix_caching": no_effect(_ENGINE_ARG),
    "trainer.nnodes": maps("nnodes"),
    "trainer.n_gpus_per_node": maps("workers_per_node"),
    "trainer.device": maps("device"),
}

GENERATION_PATTERNS: list[tuple[str, Rule]] = [
    ("rollout._target_", no_effect("verl's config class")),
    ("actor.*", no_effect(_NO_TRAINING)),
    (
        "ray_kwargs.*",
        no_effect(
            "Tandem starts Ray itself where several engines run: a local Ray, or ray_address=auto to join a cluster"
        ),
    ),
    (
        "rollout.engine_kwargs.*",
        no_effect("arguments of an engine Tandem does not run (vLLM's: engine_kwargs.vllm.*)"),
    ),
]
_VLLM_KWARGS = "rollout.engine_kwargs.vllm."
_TEMPLATE_KWARGS = "data.apply_chat_template_kwargs."


def generation_rule(key: str) -> Rule | None:
    """The rule for verl's main_generation key `key`, or None when verl's generation config has no such key."""
    if key in GENERATION_KEYS:
        return GENERATION_KEYS[key]
    if key.startswith(_VLLM_KWARGS):
        return maps("engine_kwargs." + key.removeprefix(_VLLM_KWARGS), "an argument of vLLM's engine")
    if key.startswith(_TEMPLATE_KWARGS):
        return maps(
            "chat_template_kwargs." + key.removeprefix(_TEMPLATE_KWARGS), "a variable of the chat template"
        )
    for pattern, rule in GENERATION_PATTERNS:
        if fnmatch.fnmatchcase(key, pattern):
            return rule
    return None

"""A rollout engine on vLLM, running in the worker's own process next to the training engine.

The engine is built once from a Hugging Face folder and never restarted: `update_weights` streams
the trainer's full tensors, one at a time, into vLLM's model with `reload_weights` (checkpoint-format
names: the trainer's `state_dict_iter` names, turned back into the files' names where transformers
loads a model into other tensors than its files hold, as for Mixtral's and Qwen MoE's experts), then drops the prefix cache, whose entries were
computed with the old weights. Every sync is checked: vLLM's report of its own parameters the reload
left unloaded (its fused q/k/v, gate/up and expert names) is an error, not a hidden log line. On CPU this is the only weight-loading call that keeps the model
whole over repeated loads (DESIGN.md); `load_weights` corrupts it on the second load.

In process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, so the engine core and its model live in this
process and the weight iterator is passed by reference (no copy of the model through a pipe).
One engine per process: vLLM keeps process-wide parallel state, and tearing one engine down
removes it for any other engine still alive in the same process. vLLM builds its groups on the worker
group's torch.distributed group: one engine per rank at tensor_parallel=1, or with `tensor_parallel=k`
one engine spanning k consecutive ranks (vLLM's external launcher: each of them holds 1/k of every
weight matrix, gets the same prompts and runs the same requests in step; Dispatch.REPLICA).

CPU threads: vLLM's CPU worker pins OpenMP threads to cores and from then on turns
`torch.set_num_threads` into a no-op for the whole process. A Tandem worker already owns a share
of the node's cores (trainer.cpus_per_worker) and has set its torch thread count to it, so the
engine is built with `VLLM_CPU_OMP_THREADS_BIND=nobind`: vLLM keeps the worker's thread count and
binds nothing, and training and generation take turns on the same cores instead of two thread
pools fighting over them. `VLLM_CPU_KVCACHE_SPACE` (GiB) is set from `kv_cache_gib` unless the
environment sets it (vLLM's default takes most of the machine's memory for every engine).

Log-probs: `logprobs_mode="processed_logprobs"` returns log_softmax(logits / temperature) of each
sampled token, which is what the trainer recomputes (see tandem/rollout/base.py), as long as top-k
and top-p are off (the RL default). With them on, vLLM renormalises over the tokens they keep: the
log-prob of the distribution actually sampled from, at least the full one's. The difference then
shows in rollout_mismatch/*, and rollout.is_correction can weight for it.
"""

from __future__ import annotations

import glob
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tandem.batch import Batch
from tandem.models.model_type import VISION_LANGUAGE_TYPES, folder_model_type
from tandem.models.without_torchvision import adapt_vllm
from tandem.rollout.async_engine import VLLMTurnEngine, vllm_sampling
from tandem.rollout.base import (
    RolloutEngine,
    RolloutSpec,
    SamplingParams,
    assemble,
    check_prompts,
    request_seed,
    sample_keys,
)
from tandem.rollout.vllm_models import (
    check_buildable,
    current_engine_kwargs,
    default_engine_kwargs,
    engine_kwargs_problems,
    model_problems,
    text_config,
)

logger = logging.getLogger(__name__)

TIED_EMBEDDING, TIED_HEAD = "model.embed_tokens.weight", "lm_head.weight"
VL_TIED_EMBEDDING = "model.language_model.embed_tokens.weight"  # transformers' vision-language models'
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # see "CPU threads" above


def _cpu_scheduling(device: torch.device, max_model_len: int) -> dict[str, Any]:
    """No chunked prefill on CPU: vLLM 0.32's CPU runner crashes ("CPU Generator does not use
    offset") when a seeded request's prompt is split over two engine steps, which happens as soon as
    a step's prompts pass max_num_batched_tokens (4096 by default; 64 prompts of 480 tokens do it).
    Without chunking, a prompt that does not fit waits for the next step; a step then holds at most
    max(4096, max_model_len) prompt tokens, which vLLM requires to hold the longest prompt."""
    if device.type != "cpu":
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, max_model_len)}


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.32 accepts


def _lora_serving(lora_rank: int) -> dict[str, Any]:
    """vLLM arguments to serve one LoRA adapter of rank `lora_rank` at a time ({} for 0: no LoRA)."""
    if lora_rank <= 0:
        return {}
    fits = [r for r in LORA_RANKS if r >= lora_rank]
    if not fits:
        raise ValueError(f"LoRA rank {lora_rank}: vLLM serves adapters of rank <= {LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}


def _tensor_parallel_launch(tensor_parallel: int, device: torch.device) -> dict[str, Any]:
    """vLLM arguments for an engine spanning `tensor_parallel` ranks of the worker group's torch.distributed
    group (vLLM's external launcher: every rank of the engine builds it, and runs every request, in step;
    vLLM builds its tensor-parallel groups over consecutive ranks of that group). {} for one rank."""
    if tensor_parallel == 1:
        return {}
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() % tensor_parallel:
        world = dist.get_world_size() if dist.is_initialized() else "none"
        raise ValueError(
            f"rollout.tensor_parallel={tensor_parallel} needs a worker group whose world size it divides "
            f"(torch.distributed world here: {world})"
        )
    # The external launcher reads the rank from the environment (torchrun's names); the group exists already.
    os.environ["RANK"] = str(dist.get_rank())
    os.environ["LOCAL_RANK"] = str(device.index or 0) if device.type == "cuda" else "0"
    if device.type == "cpu":
        remove_stale_cpu_shm(dist.get_rank(), tensor_parallel)
        dist.barrier()  # no rank of an engine builds it before its leftovers are gone
    return {"distributed_executor_backend": "external_launcher"}


def remove_stale_cpu_shm(rank: int, tensor_parallel: int, shm_dir: str | Path = "/dev/shm") -> list[Path]:
    """On the first rank of each engine: remove the shared-memory segments a killed engine on the same ranks
    left behind; the paths removed.

    vLLM's CPU tensor-parallel engine (under the external launcher) names its segments after the engine's
    global ranks alone (`-tp:0-[0-1]-cpushm_<rank>`, the same for every run) and creates them exclusively, so
    one left by a run that was killed (Ray kills its workers) stops every later engine on those ranks with
    "create shm in SHMManager failed. errno: 17". Removing a name leaves a live engine's mapping intact."""
    first = rank - rank % tensor_parallel
    if rank != first:
        return []
    ranks = glob.escape("[" + "-".join(str(r) for r in range(first, first + tensor_parallel)) + "]")
    stale = sorted(Path(shm_dir).glob(f"*-tp:*-{ranks}-cpushm_*"))
    for path in stale:
        logger.warning("VLLMRollout: removing %s, left by an earlier engine on ranks %s", path, ranks)
        path.unlink(missing_ok=True)
    return stale


class VLLMRollout(RolloutEngine):
    """Generates with vLLM's offline `LLM`, held in this process (see the module docstring).

    ``tokenizer_path`` is the tokenizer's folder (None = ``model_path``);
    ``max_model_len`` bounds prompt + response tokens; ``tensor_parallel``: ranks of the worker group
    this engine spans (every one of them builds it; see the module docstring);
    ``gpu_memory_utilization`` is the share of GPU memory vLLM takes for weights and KV cache
    (the trainer needs the rest); ``kv_cache_gib`` sizes the KV cache on CPU. ``override_config``:
    attributes set on the model's config (vLLM's ``hf_overrides``; the trainer's actor.override_config).
    """

    @classmethod
    def from_spec(cls, spec: RolloutSpec) -> VLLMRollout:
        """Every field of the spec: vLLM takes them all."""
        return cls.from_pretrained(
            spec.model_path,
            **spec.common_kwargs(),
            max_model_len=spec.max_model_len,
            tensor_parallel=spec.tensor_parallel,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            kv_cache_gib=spec.kv_cache_gib,
            seed=spec.seed,
            lora_rank=spec.lora_rank,
            engine_kwargs=spec.engine_kwargs,
            override_config=dict(spec.override_config) if spec.override_config else None,
        )

    check_buildable = staticmethod(check_buildable)  # vllm_models.check_buildable: read without vLLM

    def __init__(
        self,
        model_path: str | Path,
        *,
        tokenizer_path: str | Path | None = None,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_model_len: int = 2048,
        tensor_parallel: int = 1,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: int = 1,
        seed: int = 0,
        lora_rank: int = 0,
        engine_kwargs: Mapping[str, Any] | None = None,
        override_config: dict[str, Any] | None = None,
    ) -> None:
        self.device = torch.device(device)
        engine_kwargs = current_engine_kwargs(engine_kwargs or {})
        config = text_config(model_path, override_config)
        problems = engine_kwargs_problems(engine_kwargs) + model_problems(config, self.device.type)
        if problems:
            raise ValueError(f"VLLMRollout: {model_path}: " + "; ".join(problems))
        self.model_type = (config or {}).get("model_type", "unknown")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM logs its whole config at INFO from every rank; its warnings here are about CPU
        # performance libraries. VLLM_LOGGING_LEVEL=INFO (or WARNING) in the environment brings them back.
        # Its warning that a weight sync left parameters unloaded is not lost: update_weights reads it and
        # turns it into an error (reload_reporting_unloaded).
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.triton_utils")
        if self.device.type == "cpu":
            os.environ.update(CPU_ENV)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        # Qwen2-VL's parts without torchvision (models/without_torchvision.py)
        vision_language = folder_model_type(model_path) in VISION_LANGUAGE_TYPES
        if vision_language:
            adapt_vllm()
        from vllm import LLM

        forget_stale_parallel_state()
        start = time.perf_counter()
        parallel = _tensor_parallel_launch(tensor_parallel, self.device)
        # rollout.engine_kwargs last: they may change Tandem's defaults (not the arguments it sets itself)
        options = {
            **_cpu_scheduling(self.device, max_model_len),
            **default_engine_kwargs(config, self.device.type),
            **engine_kwargs,
        }
        self.llm = LLM(
            model=str(model_path),
            tokenizer=str(model_path if tokenizer_path is None else tokenizer_path),
            dtype=dtype,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=self.device.type == "cpu",
            seed=seed,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            enable_sleep_mode=self.device.type == "cuda",
            **parallel,
            **_lora_serving(lora_rank),
            **({"hf_overrides": override_config} if override_config else {}),
            **options,
        )
        self._lora: Any = None  # the LoRARequest of the adapters generate serves (None: the base weights)
        self.start_seconds = time.perf_counter() - start
        self.lora_rank, self._lora_id = lora_rank, 0
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.max_model_len = max_model_len
        # a tied model's head goes to vLLM only where its model has a head of its own (Gemma 2 has none)
        self.tied_embeddings = bool(self.llm.llm_engine.model_config.hf_config.tie_word_embeddings)
        # the head by its own name, or a vision-language model's language_model.lm_head.weight
        names = self.llm.collective_rpc(parameter_names)[0]
        self.tied_embeddings &= any(n == TIED_HEAD or n.endswith("." + TIED_HEAD) for n in names)
        # a vision-language model's loader in vLLM maps the trainer's in-memory names itself (its
        # hf_to_vllm_mapper); transformers has no causal-LM class to ask for the files' names
        self._file_names = None if vision_language else file_names(model_path)
        self._asleep = self._kv_cache_asleep = False
        self._logged_cpu_sleep = False
        logger.info("VLLMRollout: engine started in %.1f s from %s", self.start_seconds, model_path)

    # ---------------------------------------------------------------- generate
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        from vllm.inputs import TokensPrompt

        if self._asleep:
            raise RuntimeError("VLLMRollout.generate called while asleep; call wake() first")
        if self._kv_cache_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._kv_cache_asleep = False
        start = time.perf_counter()
        prompt_ids, prompt_mask = check_prompts(prompts, "VLLMRollout")
        width = int(prompt_mask.sum(dim=1).max())  # the longest prompt, padding left out
        if width + sampling.max_tokens > self.max_model_len:
            raise ValueError(
                f"VLLMRollout: prompts of {width} tokens + max_tokens={sampling.max_tokens} exceed the "
                f"engine's max_model_len={self.max_model_len}; raise data.max_prompt_length + "
                "data.max_response_length consistently"
            )
        keys = sample_keys(prompts, sampling.n)[:: sampling.n]  # one seed per prompt: its n samples follow
        images = prompts.get("multi_modal_data")  # a vision-language model's rows (data/prompts.py)
        requests, params = [], []
        for row in range(len(prompts)):
            ids = prompt_ids[row][prompt_mask[row].bool()].tolist()
            if images is not None and images[row]:  # vLLM widens each image marker itself
                request = TokensPrompt(
                    prompt_token_ids=prompts["raw_prompt_ids"][row], multi_modal_data=images[row]
                )
            else:
                request = TokensPrompt(prompt_token_ids=ids)
            requests.append(request)
            params.append(
                vllm_sampling(
                    n=sampling.n,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k,
                    max_tokens=sampling.max_tokens,
                    stop_token_ids=self.eos_token_ids,
                    seed=None if sampling.seed is None else request_seed(sampling.seed, int(keys[row])),
                )
            )
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora)
        if images is not None:
            check_widened(outputs, prompt_ids, prompt_mask)

        rows = prompts.repeat(sampling.n, interleave=True)
        total = len(rows)
        responses = torch.full((total, sampling.max_tokens), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((total, sampling.max_tokens), dtype=torch.long)
        log_probs = torch.zeros((total, sampling.max_tokens), dtype=torch.float32)
        for row, output in enumerate(outputs):
            for k, completion in enumerate(output.outputs):
                i = row * sampling.n + k
                tokens = list(completion.token_ids)[: sampling.max_tokens]
                length = len(tokens)
                responses[i, :length] = torch.tensor(tokens, dtype=torch.long)
                response_mask[i, :length] = 1
                log_probs[i, :length] = torch.tensor(
                    [entry[token].logprob for entry, token in zip(completion.logprobs, tokens, strict=True)],
                    dtype=torch.float32,
                )
        prompt_ids = prompt_ids.repeat_interleave(sampling.n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(sampling.n, dim=0)
        seconds = time.perf_counter() - start
        return assemble(rows, prompt_ids, prompt_mask, responses, response_mask, log_probs, seconds)

    def turn_engine(self) -> VLLMTurnEngine:
        """This engine, one awaitable turn at a time and continuously batched (rollout/async_engine.py)."""
        if self._asleep:
            raise RuntimeError("VLLMRollout.turn_engine called while asleep; call wake() first")
        if self._kv_cache_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._kv_cache_asleep = False
        return VLLMTurnEngine(self.llm, self.eos_token_ids, self.max_model_len, self._lora)

    # ---------------------------------------------------------------- weights
    def update_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Stream (Hugging Face name, full tensor) pairs into the running engine, one at a time. A tied model's
        head is added where vLLM's model has one; a parameter of vLLM's model the sync left unloaded, or a
        weight vLLM's loader refuses, is a RuntimeError naming the weight sync, the family and rollout.engine=hf."""
        if self.tied_embeddings:
            weights = with_tied_head(weights)
        if self._file_names is not None:
            weights = self._file_names(weights)
        fallback = "rollout.engine=hf (Hugging Face generate) trains this model without vLLM"
        try:
            unloaded = self.llm.collective_rpc(reload_reporting_unloaded, args=(iter(weights),))[0]
        except (ValueError, KeyError, RuntimeError, AssertionError, AttributeError) as error:
            raise RuntimeError(
                f"vLLM weight sync: vLLM's {self.model_type} model did not take the trainer's weights "
                f"({type(error).__name__}: {error}); {fallback}"
            ) from error
        if unloaded:
            names = sorted(unloaded)
            raise RuntimeError(
                f"vLLM weight sync: vLLM's {self.model_type} model kept {len(names)} parameter(s) of its own "
                f"unloaded ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}): the rollout would "
                f"generate with weights the trainer never sent; {fallback}"
            )
        if self.device.type == "cpu":
            self.llm.collective_rpc(repack_cpu_experts)
        self.llm.reset_prefix_cache()
        # image embeddings cached by the scheduler were computed with the old vision weights (and the workers
        # dropped theirs on reload: a cached image would then miss, "Encoder cache miss")
        self.llm.llm_engine.reset_encoder_cache()

    def load_adapter(self, folder: str | Path) -> None:
        """Serve the LoRA adapters of a PEFT adapter folder on the base weights from now on (the engine must be
        built with `lora_rank`); the adapters served before are dropped. The folder must stay until the next
        call (vLLM may reload it from there)."""
        from vllm.lora.request import LoRARequest

        if not self.lora_rank:
            raise RuntimeError("VLLMRollout.load_adapter: the engine was built without LoRA (lora_rank=0)")
        engine = self.llm.llm_engine
        self._lora_id += 1  # a new id each time: vLLM caches adapters by id
        request = LoRARequest(f"adapter-{self._lora_id}", self._lora_id, str(folder))
        if self._lora is not None:
            engine.remove_lora(self._lora.lora_int_id)
        engine.add_lora(request)  # loaded now: the sync's time holds it, and a bad folder fails here
        self._lora = request
        self.llm.reset_prefix_cache()

    # ---------------------------------------------------------------- memory
    def sleep(self) -> None:
        """Release weights and KV cache on GPU (level 1: weights offloaded to CPU); a no-op on CPU."""
        if self.device.type != "cuda":
            if not self._logged_cpu_sleep:
                logger.info("VLLMRollout: sleep is a no-op on CPU (vLLM's CPU backend has no sleep mode)")
                self._logged_cpu_sleep = True
            return
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake(self) -> None:
        """Wake the weights only: the worker syncs them next, and the KV cache wakes at the next
        `generate`, so that the sync never shares the GPU with a full KV cache."""
        if self._asleep:
            self.llm.wake_up(tags=["weights"])
            self._asleep = False
            self._kv_cache_asleep = True


def file_names(model_path: str | Path) -> Callable[[Iterable[tuple[str, Tensor]]], Iterator] | None:
    """(name, tensor) as transformers holds the model in memory -> as its checkpoint files name them, one
    tensor at a time (transformers' own reverse mapping, the one `save_pretrained` applies); None when the
    two agree. Mixtral in memory: one [E, 2F, H] `mlp.experts.gate_up_proj` per layer; in its files and
    vLLM's loader: `block_sparse_moe.experts.{e}.w1` / `w3` [F, H] per expert."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import revert_weight_conversion

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    except (ValueError, KeyError, OSError) as error:  # an architecture transformers' causal-LM class lacks
        logger.warning(
            "VLLMRollout: no transformers causal LM for %s (%s); weights are synced under the trainer's names",
            model_path,
            error,
        )
        return None
    if not get_model_conversion_mapping(model, add_legacy=False):
        return None

    def convert(weights: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in weights:
            yield from revert_weight_conversion(model, {name: tensor}).items()

    return convert


def parameter_names(worker: Any) -> list[str]:
    """The names of the vLLM worker's model's parameters, a tied head's included (run in the worker)."""
    return [name for name, _ in worker.get_model().named_parameters(remove_duplicate=False)]


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.inplace"
# parameters vLLM computes from loaded ones after loading (MLA's absorbed up-projections, from kv_b_proj):
# no checkpoint holds them, and vLLM's report names them after every reload
DERIVED_AFTER_LOADING = frozenset(
    {"W_UK_T", "W_UV", "W_UK_T_dcp_qrep", "W_K", "W_V", "W_K_scale", "W_V_scale"}
)


class _UnloadedReport(logging.Handler):
    """Keeps the names vLLM's in-place reload reports not loaded (the set its warning carries)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.names: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if "not loaded" in str(record.msg) and args and isinstance(args[0], set | frozenset):
            self.names |= set(args[0])


def reload_reporting_unloaded(worker: Any, weights: Iterator[tuple[str, Tensor]]) -> set[str]:
    """Reload the worker's model in place from checkpoint-format `weights`; returns the names of the model's
    parameters the reload left unloaded (run in every vLLM worker).

    vLLM's reload compares the model's parameters with the names its `load_weights` reports loaded (vLLM's
    own names: fused q/k/v and gate/up, stacked experts) and only logs what is missing, at WARNING, which
    the VLLM_LOGGING_LEVEL=ERROR that Tandem sets hides: the report is read from that log record for the
    call (its test: tests/rollout/test_vllm.py makes a parameter go unloaded on purpose)."""
    report, log = _UnloadedReport(), logging.getLogger(RELOAD_LOGGER)
    level = log.level
    log.addHandler(report)
    log.setLevel(logging.WARNING)
    try:
        worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    finally:
        log.removeHandler(report)
        log.setLevel(level)
    return {name for name in report.names if name.rsplit(".", 1)[-1] not in DERIVED_AFTER_LOADING}


def repack_cpu_experts(worker: Any) -> int:
    """Put a reloaded mixture-of-experts model's expert weights back into the CPU kernel's layout; returns
    the layers repacked. Run in every vLLM worker after `reload_weights` on CPU.

    vLLM 0.32's CPU MoE experts keep w13 / w2 prepacked for their grouped GEMM (`process_weights_after_loading`
    of the CPU experts classes). A reload loads checkpoint-layout weights and, treating it as a weight update
    (the kernel exists already), skips that prepacking: the experts then compute with unpacked weights and
    the rollout's log-probs leave the trainer's (measured: |log ratio| up to 2.7 after one sync of the same
    weights). Repacking the reloaded tensors is what the first load did. Experts whose intermediate size the
    kernel pads are refused (their reload would not fit the padded tensors anyway)."""
    count = 0
    for layer in worker.get_model().modules():
        kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is None or not type(experts).__module__.endswith(".cpu_moe"):
            continue
        config = experts.moe_config
        if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            raise RuntimeError(
                f"vLLM CPU rollout: the experts' intermediate size per rank ({config.intermediate_size_per_partition}) "
                "is padded by vLLM's CPU MoE kernel, whose weights a weight sync cannot refresh; pick a "
                "rollout.tensor_parallel that leaves a multiple of 32, or rollout.engine=hf"
            )
        experts.process_weights_after_loading(layer)
        count += 1
    return count


def with_tied_head(weights: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """`weights`, plus the embedding again as the head right after it when the sender left the head
    out (a tied model's head IS the embedding; vLLM's reload rebuilds the head from its own name and
    would keep the old weights without it). Only for a vLLM model that has an `lm_head` (Gemma 2's takes
    its logits from the embedding and refuses one). The embedding: `model.embed_tokens.weight`, or a
    vision-language model's `model.language_model.embed_tokens.weight`."""
    head_sent = False
    for name, tensor in weights:
        head_sent = head_sent or name == TIED_HEAD
        yield name, tensor
        if name in (TIED_EMBEDDING, VL_TIED_EMBEDDING) and not head_sent:
            head_sent = True
            yield TIED_HEAD, tensor


def check_widened(outputs: Sequence[Any], prompt_ids: Tensor, prompt_mask: Tensor) -> None:
    """vLLM's prompt ids (each image marker widened by its processor) must be the prompt batch's (widened by
    the dataset's processor): the trainer scores the samples against the batch's ids."""
    for row, output in enumerate(outputs):
        expected = prompt_ids[row][prompt_mask[row].bool()].tolist()
        if list(output.prompt_token_ids) != expected:
            raise RuntimeError(
                f"VLLMRollout: prompt {row} holds {len(expected)} tokens with its images widened by the dataset's "
                f"processor, {len(output.prompt_token_ids)} as vLLM widened them; the model folder's processor "
                "settings (min_pixels / max_pixels) must be the ones the data was prepared with"
            )


# vLLM's process-wide groups (vllm.distributed.parallel_state), built on torch.distributed's group.
PARALLEL_STATE_GLOBALS = ("_TP", "_ETP", "_ENGRAM_DP", "_DCP", "_PP", "_DP", "_EP", "_EPLB", "_PCP")
WORLD_GLOBALS = ("_WORLD", "_INNER_DP_WORLD", "_NODE_COUNT")


def forget_stale_parallel_state() -> bool:
    """Drop vLLM's process-wide groups when the torch.distributed group under them is gone.

    An in-process worker group destroys its process group on shutdown; vLLM still holds groups
    built on it, and the next engine in the same process (a second in-process run, an eval after
    training) would fail to start on them. Those groups cannot be destroyed any more, so they are
    forgotten. Returns whether they were. Reads vLLM's private module state: its test
    (tests/rollout/test_vllm.py) fails if vLLM renames it."""
    from vllm.distributed import parallel_state

    world = parallel_state._WORLD
    if world is None:
        return False
    try:
        torch.distributed.get_backend(world.device_group)
        return False  # alive: an engine started on it may still be in use
    except (ValueError, RuntimeError, AttributeError):
        pass
    for name in (*PARALLEL_STATE_GLOBALS, *WORLD_GLOBALS):
        setattr(parallel_state, name, None)
    return True

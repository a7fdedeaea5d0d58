"""Workload W1 (issue 6): where a GRPO step's time goes, and how far it is from raw vLLM + raw PyTorch.

    .venv/bin/python bench/grpo_w1.py [--steps 5] [--sections main,padded,scaling] [--json PATH]
    .venv/bin/python bench/grpo_w1.py --quick     # development only: 4 prompts x 2 samples, 16 tokens, 1+1 steps

W1, fixed and seeded: the tiny Qwen2 of `tandem.models.tiny.save_tiny` (hidden 256, intermediate 768, 4 layers,
4 heads, 2 KV heads, tied embeddings, fp32); prompts "a+b=" (a, b uniform in [0, 99], raw text:
data.chat_template=none); 32 prompts x 8 samples, at most 64 response tokens, temperature 1.0; the
grpo preset with one optimizer step per training step (actor.ppo_mini_batch_size = train_batch_size),
lr 1e-5; Ray, 1 FSDP rank of 2 CPUs, vLLM rollout. Two variants: no reference model (no-ref), and
a KL loss to a reference model (kl-ref: actor.use_kl_loss=true, kl_loss_coef=0.04). Every
configuration runs in a child process of its own (one vLLM engine per process, peak memory per
configuration): 1 warm-up step, then --steps measured ones, medians over those.

Phases of a step, from the trainer's metrics:
  generate     timing_s/generate - timing_s/weight_sync (the controller's generate call holds the sync)
  weight sync  timing_s/weight_sync (the actor's weights streamed into vLLM, the worker's clock)
  log-probs    timing_s/old_log_probs (0 where the step skips that pass)
  reference    timing_s/ref_log_probs
  update       timing_s/update_actor
  other        the step minus the five above: rewards, advantages, dispatch and batch handling
Each phase is a median on its own, so the medians need not add up to the median step.
generated tok/s = response tokens / generate; training tok/s = prompt + response tokens /
(log-probs + reference + update). Peak memory is the largest peak RSS of a worker rank.

Raw baselines, measured in the same run on the same model folder and prompts, each in its own process:
  vLLM     `vllm.LLM` with Tandem's CPU settings (in process, unbound threads, the same KV-cache size,
           max_model_len and eager mode), SamplingParams(n, temperature=1.0, max_tokens, seed), no
           log-probs and no detokenizing (Tandem asks for log-probs: a stricter baseline), text prompts
           (the same token ids): generated tokens per second, median of 3 `generate` calls after a warm-up.
  PyTorch  `AutoModelForCausalLM` (fp32, sdpa) and torch.optim.AdamW(lr=1e-5) on the sequences raw vLLM
           generated, in micro-batches of 32 samples right-padded to their own longest (one batch
           of all samples runs past the CPU's caches and is slower): forward/backward of a token-mean
           loss of the response log-probs over the micro-batches + one optimizer step, and one no-grad
           forward of the response log-probs (the reference's work). Prompt + response tokens per
           second, median of 3 after a warm-up.
  matmul   torch.mm of two 2048 x 2048 matrices at torch's default threads, best of 5: the fp32 peak
           (MFU is against it) and the bf16 one.

Overhead ratio = median step s / ideal s, where
  ideal s = generated tokens / raw vLLM tok/s + step tokens / raw train tok/s
            [+ step tokens / raw forward tok/s with a reference model]
(generated tokens: the step's response tokens; step tokens: its prompt + response tokens).

FLOPs per step (model FLOPs: padding and recomputation are not counted):
  fwd(T) = T x (2 N + 4 L H C)          forward of T tokens; N = non-embedding parameters + the LM head
                                        (vocab x hidden, once though tied), L layers, H hidden size,
                                        C the mean sequence length (attention: QK^T and AV, 2 L H C each)
  step   = fwd(T_gen) + 3 fwd(T) + fwd(T) per extra no-grad forward (reference; old log-probs when timed)
where T_gen = response tokens, T = prompt + response tokens; 3 fwd(T) = 6 N T + attention (forward +
backward of the update). Achieved FLOP/s = step FLOPs / median step s; MFU = achieved / fp32 peak.

Also: the training phase (log-probs + reference + update) with Tandem's defaults vs every
training-side optimisation off (PADDED below: padded fixed-size micro-batches of 8, the old-log-prob pass), and scaling rows (no-ref, 1 warm-up + 3 steps): samples doubled,
response length doubled, and 2 FSDP ranks of 1 CPU each. Sections `sizes` and `compile` (issue 20): three
model sizes (W1, 8x, ~100 M) before / after the trainer's changes, and eager / compiled decoder layers
(actor.fsdp.torch_compile; the compile time, timing_s/compile, is paid before the first step). Section
`tp_sync` (issue 18): a vLLM engine over 2 ranks refreshed with whole tensors or shard-only, W1 and 8x.
Section `dumps`: the no-ref step with trainer.rollout_data_dir on and off (with and without the
old-log-prob pass, whose rows carry per-token mismatch), 2 runs of each, alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

SECTIONS = (
    "main",
    "padded",
    "ablation",
    "scaling",
    "engines",
    "parallel",
    "moe",
    "layouts",
    "sizes",
    "compile",
    "lora",
    "tp_sync",
    "dumps",
)
LR = 1e-5
KL_COEF = 0.04
MAX_PROMPT_LENGTH = 16  # "99+99=" is 6 tokens
DATA_ROWS = 1024
SEED = 1
CHILD_TIMEOUT_S = 3600
RAW_MICRO_ROWS = 32  # samples per micro-batch of the raw PyTorch baseline
VARIANTS = {
    "no-ref": ["actor.use_kl_loss=false"],
    "kl-ref": ["actor.use_kl_loss=true", f"actor.kl_loss_coef={KL_COEF}"],
}
PADDED = [  # every training-side optimisation off
    "actor.sequence_packing=false",
    "actor.use_dynamic_bsz=false",
    "actor.old_log_probs_from_update=false",
    "actor.micro_batch_size_per_rank=8",
    "rollout.log_prob_micro_batch_size_per_rank=8",
    "reference.log_prob_micro_batch_size_per_rank=8",
]
# One optimisation off at a time (no-ref): what each one is worth on its own.
ABLATIONS = {
    "no packing": ["actor.sequence_packing=false"],
    "micro-batches of 8": [
        "actor.use_dynamic_bsz=false",
        "actor.micro_batch_size_per_rank=8",
        "rollout.log_prob_micro_batch_size_per_rank=8",
    ],
    "old-log-prob pass": ["actor.old_log_probs_from_update=false"],
}
TARGETS = {"overhead": 1.3, "train_speedup": 1.5, "weight_sync_share": 0.05}


@dataclass(frozen=True)
class Workload:
    """One training configuration: sizes, measured steps and FSDP ranks."""

    prompts: int = 32
    samples: int = 8
    tokens: int = 64
    steps: int = 5  # measured, after 1 warm-up step
    ranks: int = 1

    def label(self) -> str:
        rank = "rank" if self.ranks == 1 else "ranks"
        return f"{self.prompts}x{self.samples}, {self.tokens} tok, {self.ranks} {rank}"


# ---- children: one configuration each ---------------------------------------------------------------


def tandem_overrides(work: Workload, folder: Path, data: Path, out: Path, extra: list[str]) -> list[str]:
    """The grpo preset's overrides for W1 at `work`'s sizes; `extra` comes last and wins."""
    return [
        f"actor.model_path={folder}",
        f"data.train_files=[{data}]",
        "data.chat_template=none",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={work.tokens}",
        f"data.train_batch_size={work.prompts}",
        f"rollout.n={work.samples}",
        "rollout.temperature=1.0",
        "rollout.engine=vllm",
        f"actor.ppo_mini_batch_size={work.prompts}",
        f"actor.optim.lr={LR}",
        "trainer.backend=ray",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        f"trainer.workers_per_node={work.ranks}",
        f"trainer.cpus_per_worker={2 // work.ranks}",
        f"trainer.total_training_steps={1 + work.steps}",
        f"trainer.seed={SEED}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume=disable",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        f"trainer.output_dir={out}",
        "trainer.project_name=w1",
        *extra,
    ]


# the metric groups the summaries read
KEPT = (
    "step",
    "timing_s",
    "perf",
    "memory",
    "async",
    "weight_sync",
    "response_length",
    "rollout_mismatch",
    "score",
)


def child_tandem(spec: dict[str, Any]) -> dict[str, Any]:
    """Train W1 for 1 + steps steps; the per-step metrics."""
    from tandem.config import load_config
    from tandem.trainer.ppo import RLTrainer

    cfg = load_config("grpo", spec["overrides"], require_data=True)
    history = RLTrainer(cfg).fit()
    steps = [m for m in history if "timing_s/step" in m]
    return {"steps": [{k: v for k, v in m.items() if k.split("/")[0] in KEPT} for m in steps]}


def child_raw_vllm(spec: dict[str, Any]) -> dict[str, Any]:
    """Raw vLLM on the same prompts: generated tokens/s, and the sequences for the PyTorch baseline."""
    from tandem.config.schema import RolloutConfig
    from tandem.rollout.vllm import CPU_ENV

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.update(CPU_ENV)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(RolloutConfig().cpu_kv_cache_gib))
    from vllm import LLM, SamplingParams

    work = Workload(**spec["work"])
    llm = LLM(
        model=spec["folder"],
        dtype="float32",
        max_model_len=MAX_PROMPT_LENGTH + work.tokens,
        enforce_eager=True,
        seed=SEED,
        enable_prefix_caching=True,
    )
    params = SamplingParams(
        n=work.samples, temperature=1.0, max_tokens=work.tokens, seed=SEED, detokenize=False
    )
    llm.generate(spec["prompts"], params, use_tqdm=False)  # warm-up
    rates, outputs = [], []
    for _ in range(3):
        start = time.perf_counter()
        outputs = llm.generate(spec["prompts"], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        rates.append(sum(len(c.token_ids) for o in outputs for c in o.outputs) / seconds)
    sequences = [
        {"prompt": list(o.prompt_token_ids), "response": list(c.token_ids)}
        for o in outputs
        for c in o.outputs
    ]
    return {"gen_tokens_per_s": statistics.median(rates), "sequences": sequences}


def child_raw_torch(spec: dict[str, Any]) -> dict[str, Any]:
    """Matmul peaks, then plain PyTorch fwd/bwd/AdamW and no-grad forward on raw vLLM's sequences."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    peaks = {name: matmul_peak(dtype) for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    model = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    # Micro-batches of RAW_MICRO_ROWS samples, each right-padded to its own longest: what a plain loop
    # does well on a CPU (one [256, T] batch runs past the caches and is slower).
    chunks = [
        right_padded(spec["sequences"][i : i + RAW_MICRO_ROWS], model.config.pad_token_id)
        for i in range(0, len(spec["sequences"]), RAW_MICRO_ROWS)
    ]
    tokens = sum(int(mask.sum()) for _, mask, _ in chunks)
    response_tokens = sum(int(response[:, 1:].sum()) for _, _, response in chunks)

    def response_log_probs(input_ids: Any, attention_mask: Any) -> Any:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
        picked = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        return picked - logits.logsumexp(-1)

    def train_step() -> None:
        model.train()
        for input_ids, attention_mask, response_mask in chunks:
            mask = response_mask[:, 1:]
            loss = -(response_log_probs(input_ids, attention_mask) * mask).sum() / response_tokens
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            for input_ids, attention_mask, _ in chunks:
                response_log_probs(input_ids, attention_mask)

    return {
        "threads": torch.get_num_threads(),
        "peak_flops": peaks,
        "tokens": tokens,
        "train_tokens_per_s": tokens / median_seconds(train_step),
        "forward_tokens_per_s": tokens / median_seconds(forward),
    }


def matmul_peak(dtype: Any, size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of the fastest of `repeats` torch.mm calls on size x size matrices, after a warm-up: the
    trainer's own probe (tandem/engine/auto_dtype.py) at this size."""
    from tandem.engine.auto_dtype import matmul_rate

    return matmul_rate(dtype, (size, size, size), repeats)


def right_padded(sequences: list[dict[str, list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    """input_ids, attention_mask and response_mask [samples, longest] of prompt + response, right-padded."""
    import torch

    width = max(len(s["prompt"]) + len(s["response"]) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros_like(input_ids)
    for i, s in enumerate(sequences):
        ids, start = s["prompt"] + s["response"], len(s["prompt"])
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        response_mask[i, start : len(ids)] = 1
    return input_ids, attention_mask, response_mask


def median_seconds(fn: Any, repeats: int = 3) -> float:
    fn()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


CHILDREN = {"tandem": child_tandem, "raw_vllm": child_raw_vllm, "raw_torch": child_raw_torch}


def run_child(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = CHILDREN[spec["kind"]](spec)
    Path(spec["out"]).write_text(json.dumps(result))


# ---- the parent: runs the children, summarises, prints ---------------------------------------------


class Runner:
    """Runs each configuration in a child process of its own, its output in <workdir>/<name>.log."""

    def __init__(self, workdir: Path, folder: Path, data: Path, prompts: list[str]) -> None:
        self.workdir, self.folder, self.data = workdir, folder, data
        self.prompts = prompts  # the data file's, in order
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}

    def child(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        slug = name.replace("/", "-")
        spec_path = self.workdir / f"{slug}.spec.json"
        out, log = self.workdir / f"{slug}.out.json", self.workdir / f"{slug}.log"
        spec_path.write_text(json.dumps({**spec, "out": str(out)}))
        say(f"{name} ...")
        start = time.perf_counter()
        with log.open("w") as f:
            process = subprocess.Popen(
                [sys.executable, __file__, "--child", str(spec_path)],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group, to stop it and everything it started
            )
            try:
                rc = process.wait(timeout=CHILD_TIMEOUT_S)
            except BaseException:
                os.killpg(process.pid, 9)
                process.wait()
                raise
        if rc != 0:
            tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
            raise SystemExit(
                f"{name} failed (exit {rc}); the last lines of {log}:\n{tail}\n"
                f"(if Ray processes are left over: .venv/bin/ray stop --force)"
            )
        say(f"{name} done in {time.perf_counter() - start:.0f} s")
        return json.loads(out.read_text())

    def tandem(self, name: str, work: Workload, extra: list[str]) -> dict[str, Any]:
        experiment = f"trainer.experiment_name={name.replace('/', '-')}"
        overrides = tandem_overrides(
            work, self.folder, self.data, self.workdir / "runs", [*extra, experiment]
        )
        result = self.child(name, {"kind": "tandem", "overrides": overrides})
        return {"work": asdict(work), "overrides": overrides, **result}


def phases(m: dict[str, float]) -> dict[str, float]:
    """One step's phases in seconds (the module docstring says what each holds)."""
    sync = m.get("timing_s/weight_sync", 0.0)
    p = {
        "step": m["timing_s/step"],
        "generate": m["timing_s/generate"] - sync,
        "weight_sync": sync,
        "log_probs": m.get("timing_s/old_log_probs", 0.0),
        "reference": m.get("timing_s/ref_log_probs", 0.0),
        "update": m.get("timing_s/update_actor", 0.0),
    }
    p["other"] = p["step"] - sum(v for k, v in p.items() if k != "step")
    p["train"] = p["log_probs"] + p["reference"] + p["update"]
    return p


def summarise(run: dict[str, Any], model: dict[str, int], raw: dict[str, Any] | None) -> dict[str, float]:
    """Medians over the measured steps (the warm-up step dropped), throughput, FLOPs, overhead ratio."""
    measured = run["steps"][1:]
    per_step = [phases(m) for m in measured]
    s = {k: statistics.median(p[k] for p in per_step) for k in per_step[0]}
    gen_tokens = statistics.median(m["perf/response_tokens"] for m in measured)
    tokens = statistics.median(m["perf/total_tokens"] for m in measured)
    s["generated_tokens"], s["tokens"] = gen_tokens, tokens
    s["gen_tokens_per_s"] = statistics.median(
        m["perf/response_tokens"] / p["generate"] for m, p in zip(measured, per_step)
    )
    s["train_tokens_per_s"] = statistics.median(
        m["perf/total_tokens"] / p["train"] for m, p in zip(measured, per_step) if p["train"] > 0
    )
    s["weight_sync_share"] = s["weight_sync"] / s["step"]
    s["peak_rss_gib"] = max(m.get("memory/peak_rss_gib", 0.0) for m in run["steps"])
    extra_forwards = (s["reference"] > 0) + (s["log_probs"] > 0)
    context = tokens / statistics.median(m["perf/samples"] for m in measured)
    s["context"] = context  # the mean sequence length of the FLOP formulas
    s["flops"] = step_flops(model, gen_tokens, tokens, context, extra_forwards)
    s["flops_per_s"] = s["flops"] / s["step"]
    if raw is not None:
        s["mfu"] = s["flops_per_s"] / raw["peak_flops"]["fp32"]
        ideal = gen_tokens / raw["gen_tokens_per_s"] + tokens / raw["train_tokens_per_s"]
        if s["reference"] > 0:
            ideal += tokens / raw["forward_tokens_per_s"]
        s["ideal_s"], s["overhead"] = ideal, s["step"] / ideal
    return s


def forward_flops(model: dict[str, int], tokens: float, context: float) -> float:
    """fwd(T) = T (2 N + 4 L H C): matmuls with the weights, plus attention's QK^T and AV."""
    return tokens * (2 * model["params"] + 4 * model["layers"] * model["hidden"] * context)


def step_flops(
    model: dict[str, int], gen_tokens: float, tokens: float, context: float, forwards: int
) -> float:
    """Generation + forward and backward of the update + the extra no-grad forwards."""
    return forward_flops(model, gen_tokens, context) + (3 + forwards) * forward_flops(model, tokens, context)


def model_numbers(folder: Path) -> dict[str, int]:
    """N (non-embedding parameters + the LM head, counted once though tied), layers, hidden size: the
    trainer's own count (tandem/engine/flops.py, behind perf/mfu/actor)."""
    from tandem.engine.flops import ModelFlops

    model = ModelFlops.from_folder(folder)
    return {"params": int(model.params), "layers": model.layers, "hidden": model.hidden}


# ---- printing -----------------------------------------------------------------------------------------

SYNC_TARGET = f"< {100 * TARGETS['weight_sync_share']:.0f}"
OVERHEAD_TARGET = f"<= {TARGETS['overhead']}"
ROWS = [  # (label, key, format, scale, target)
    ("step s (median)", "step", "{:.3f}", 1, ""),
    ("  generate s", "generate", "{:.3f}", 1, ""),
    ("  weight sync s", "weight_sync", "{:.3f}", 1, ""),
    ("  log-probs s", "log_probs", "{:.3f}", 1, ""),
    ("  reference s", "reference", "{:.3f}", 1, ""),
    ("  update s", "update", "{:.3f}", 1, ""),
    ("  other s", "other", "{:.3f}", 1, ""),
    ("weight sync share %", "weight_sync_share", "{:.1f}", 100, SYNC_TARGET),
    ("generated tokens / step", "generated_tokens", "{:.0f}", 1, ""),
    ("prompt+response tokens / step", "tokens", "{:.0f}", 1, ""),
    ("generated tok/s", "gen_tokens_per_s", "{:.0f}", 1, ""),
    ("training tok/s", "train_tokens_per_s", "{:.0f}", 1, ""),
    ("achieved GFLOP/s", "flops_per_s", "{:.2f}", 1e-9, ""),
    ("MFU % (fp32 matmul peak)", "mfu", "{:.2f}", 100, ""),
    ("peak RSS GiB (worker)", "peak_rss_gib", "{:.2f}", 1, ""),
    ("ideal s (raw vLLM + PyTorch)", "ideal_s", "{:.3f}", 1, ""),
    ("overhead ratio", "overhead", "{:.2f}", 1, OVERHEAD_TARGET),
]


def print_main(work: Workload, model: dict[str, int], raw: dict[str, Any], main: dict[str, dict]) -> None:
    peak = raw["peak_flops"]
    print(
        f"\nW1: GRPO on the tiny Qwen2 ({model['params'] / 1e6:.2f} M matmul parameters, fp32), "
        f"{work.prompts} prompts x {work.samples} samples x <= {work.tokens} tokens, 1 FSDP rank of 2 CPUs, "
        f"1 warm-up + {work.steps} measured steps"
    )
    print(
        f"raw, same run: vLLM {raw['gen_tokens_per_s']:.0f} generated tok/s; PyTorch fwd+bwd+AdamW "
        f"{raw['train_tokens_per_s']:.0f} tok/s, no-grad forward {raw['forward_tokens_per_s']:.0f} tok/s; "
        f"matmul peak fp32 {peak['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s "
        f"({raw['threads']} threads)"
    )
    print(f"\n{'':<32}" + "".join(f"{v:>12}" for v in main) + f"{'target':>12}")
    for label, key, fmt, scale, target in ROWS:
        cells = "".join(
            f"{fmt.format(s[key] * scale):>12}" if key in s else f"{'-':>12}" for s in main.values()
        )
        print(f"{label:<32}{cells}{target:>12}")
    print(
        "overhead ratio = step s / (generated tokens / raw vLLM tok/s + step tokens / raw train tok/s"
        " [+ step tokens / raw forward tok/s with a reference])"
    )


def print_padded(padded: dict[str, dict[str, float]]) -> None:
    print(
        "\ntraining phase (log-probs + reference + update), median s: defaults vs optimisations off "
        "(padded micro-batches of 8, old-log-prob pass)"
    )
    print(f"{'variant':<12}{'defaults':>12}{'padded':>12}{'speed-up':>12}{'target':>12}")
    for variant, row in padded.items():
        print(
            f"{variant:<12}{row['defaults']:>12.3f}{row['padded']:>12.3f}{row['speedup']:>11.2f}x"
            f"{'>= ' + str(TARGETS['train_speedup']) + 'x':>12}"
        )
    print("padded: " + " ".join(PADDED))


def print_ablation(rows: dict[str, dict[str, float]]) -> None:
    print("\nablation (no-ref; one optimisation off at a time, 1 warm-up + 3 measured steps)")
    print(f"{'off':<24}{'train s':>10}{'x defaults':>12}{'step s':>10}")
    for label, r in rows.items():
        print(f"{label:<24}{r['train']:>10.3f}{r['train_ratio']:>12.2f}{r['step']:>10.3f}")
    print("x defaults = training phase s / the defaults' (the main no-ref run)")


def print_scaling(rows: dict[str, dict[str, float]]) -> None:
    print("\nscaling (no-ref; the baseline is the main run, the others 1 warm-up + 3 measured steps)")
    print(f"{'config':<28}{'step s':>10}{'x base':>10}{'x work':>10}{'train s':>10}{'generate s':>12}")
    for label, r in rows.items():
        print(
            f"{label:<28}{r['step']:>10.3f}{r['step_ratio']:>10.2f}{r['work_ratio']:>10.2f}"
            f"{r['train']:>10.3f}{r['generate']:>12.3f}"
        )
    print(
        "x base = step s / the baseline's; x work = prompt + response tokens / the baseline's (linear: equal)"
    )


# ---- main ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=5, help="measured steps after 1 warm-up step (>= 5 for W1)"
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help="any of: " + ",".join(SECTIONS))
    parser.add_argument("--json", help="also write every number to this file")
    parser.add_argument("--quick", action="store_true", help="development only: a tiny workload, no scaling")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child)
        return
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; choose from {list(SECTIONS)}")
    work = Workload(steps=args.steps)
    if args.quick:
        work = Workload(prompts=4, samples=2, tokens=16, steps=1)
        sections = [s for s in sections if s != "scaling"]

    workdir = Path(tempfile.mkdtemp(prefix="tandem-w1-"))
    say(f"work folder {workdir}")
    runner = prepare(workdir)
    model = model_numbers(runner.folder)
    results: dict[str, Any] = {"workload": asdict(work), "model": model, "targets": TARGETS, "runs": {}}
    if "main" in sections:
        main_section(runner, work, model, results)
    if "padded" in sections:
        padded_section(runner, work, model, results)
    if "ablation" in sections:
        ablation_section(runner, work, model, results)
    if "scaling" in sections:
        scaling_section(runner, work, model, results)
    if "engines" in sections:
        engines_section(runner, work, model, results)
    if "parallel" in sections:
        parallel_section(runner, work, model, results)
    if "moe" in sections:
        moe_section(runner, work, results)
    if "layouts" in sections:
        layouts_section(runner, work, results)
    if "sizes" in sections:
        sizes_section(runner, work, results)
    if "compile" in sections:
        compile_section(runner, work, results)
    if "tp_sync" in sections:
        tp_sync_section(runner, work, results)
    if "lora" in sections:
        lora_section(runner, work, results)
    if "dumps" in sections:
        dumps_section(runner, work, results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        say(f"numbers in {args.json}")
    shutil.rmtree(workdir, ignore_errors=True)


def prepare(workdir: Path) -> Runner:
    """The model folder and the prompts of W1 in `workdir`."""
    from tandem.data import make_rows, write_rows
    from tandem.models.tiny import save_tiny

    folder = save_tiny(workdir / "model")
    rows = make_rows("addition", DATA_ROWS, seed=0, digits=2)
    for row in rows:  # raw text: what the model sees is exactly "a+b="
        row["prompt"] = row["prompt"][0]["content"]
    data = write_rows(rows, workdir / "train.parquet")
    return Runner(workdir, folder, data, [row["prompt"] for row in rows])


def main_section(runner: Runner, work: Workload, model: dict[str, int], results: dict[str, Any]) -> None:
    """The raw baselines, then both variants with every number."""
    spec = {"folder": str(runner.folder), "work": asdict(work)}
    raw = runner.child("raw/vllm", {**spec, "kind": "raw_vllm", "prompts": runner.prompts[: work.prompts]})
    sequences = raw.pop("sequences")
    raw.update(runner.child("raw/torch", {**spec, "kind": "raw_torch", "sequences": sequences}))
    results["raw"] = raw
    for variant in VARIANTS:
        main_run(runner, work, variant, results)
    results["main"] = {v: summarise(results["runs"][f"main/{v}"], model, raw) for v in VARIANTS}
    print_main(work, model, raw, results["main"])


def padded_section(runner: Runner, work: Workload, model: dict[str, int], results: dict[str, Any]) -> None:
    """The training phase with the defaults vs padded fixed-size micro-batches, per variant."""
    runs, results["padded"] = results["runs"], {}
    for variant, extra in VARIANTS.items():
        defaults = summarise(main_run(runner, work, variant, results), model, None)["train"]
        runs[f"padded/{variant}"] = runner.tandem(f"padded/{variant}", work, [*extra, *PADDED])
        padded = summarise(runs[f"padded/{variant}"], model, None)["train"]
        results["padded"][variant] = {"defaults": defaults, "padded": padded, "speedup": padded / defaults}
    print_padded(results["padded"])


def ablation_section(runner: Runner, work: Workload, model: dict[str, int], results: dict[str, Any]) -> None:
    """No-ref training phase with each optimisation off on its own, against the defaults."""
    base = summarise(main_run(runner, work, "no-ref", results), model, None)
    rows = {"nothing (defaults)": base}
    for label, extra in ABLATIONS.items():
        name = "ablation/" + label.replace(" ", "-")
        results["runs"][name] = runner.tandem(name, replace(work, steps=3), [*VARIANTS["no-ref"], *extra])
        rows[label] = summarise(results["runs"][name], model, None)
    results["ablation"] = {
        label: {"train": r["train"], "train_ratio": r["train"] / base["train"], "step": r["step"]}
        for label, r in rows.items()
    }
    print_ablation(results["ablation"])


def scaling_section(runner: Runner, work: Workload, model: dict[str, int], results: dict[str, Any]) -> None:
    """No-ref step time with twice the samples, twice the tokens, 2 ranks; against the main run."""
    short = replace(work, steps=3)
    scaled = {
        "scaling/2x-samples": replace(short, prompts=2 * work.prompts),
        "scaling/2x-tokens": replace(short, tokens=2 * work.tokens),
        "scaling/2-ranks": replace(short, ranks=2),
    }
    base = summarise(main_run(runner, work, "no-ref", results), model, None)
    rows = {work.label(): base}
    for name, scaled_work in scaled.items():
        results["runs"][name] = runner.tandem(name, scaled_work, VARIANTS["no-ref"])
        rows[scaled_work.label()] = summarise(results["runs"][name], model, None)
    results["scaling"] = {
        label: {
            "step": s["step"],
            "step_ratio": s["step"] / base["step"],
            "work_ratio": s["tokens"] / base["tokens"],
            "train": s["train"],
            "generate": s["generate"],
        }
        for label, s in rows.items()
    }
    print_scaling(results["scaling"])


# The no-ref step on megatron-core (actor.strategy=megatron) in three layouts of the same 2 cores.
ENGINES = {
    "megatron, 1 rank": (1, ["actor.strategy=megatron"]),
    "megatron TP=2, 2 ranks": (2, ["actor.strategy=megatron", "actor.megatron.tensor_parallel=2"]),
    "megatron PP=2, 2 ranks": (2, ["actor.strategy=megatron", "actor.megatron.pipeline_parallel=2"]),
}


def engines_section(runner: Runner, work: Workload, model: dict[str, int], results: dict[str, Any]) -> None:
    """No-ref step on megatron-core (1 rank, TP=2, PP=2) against the main (FSDP2, 1 rank) run."""
    base = summarise(main_run(runner, work, "no-ref", results), model, None)
    configs = {
        label: (replace(work, steps=3, ranks=ranks), extra) for label, (ranks, extra) in ENGINES.items()
    }
    title = "engines (no-ref; megatron rows 1 warm-up + 3 measured steps)"
    compare_runs(runner, model, results, "engines", configs, ("fsdp2, 1 rank (main run)", base), title)


# Parallel layouts of issue 18 on the same 2 cores, against 2 plain data-parallel ranks: one Ulysses group
# of 2 ranks that split every sequence (packed, padded), one vLLM engine over both ranks (rollout TP=2), and
# megatron TP=2 without and with its sequence parallel, PP=2 without and with virtual stages, context parallel.
PARALLEL = {
    "fsdp2 SP=2, 2 ranks": ["actor.fsdp.sequence_parallel=2"],
    "fsdp2 SP=2, padded": ["actor.fsdp.sequence_parallel=2", "actor.sequence_packing=false"],
    "fsdp2 DP=2, rollout TP=2": ["rollout.tensor_parallel=2"],
    "megatron TP=2": ["actor.strategy=megatron", "actor.megatron.tensor_parallel=2"],
    "megatron TP=2 + SP": [
        "actor.strategy=megatron",
        "actor.megatron.tensor_parallel=2",
        "actor.megatron.sequence_parallel=true",
    ],
    "megatron PP=2": ["actor.strategy=megatron", "actor.megatron.pipeline_parallel=2"],
    "megatron PP=2 x VP=2": [
        "actor.strategy=megatron",
        "actor.megatron.pipeline_parallel=2",
        "actor.megatron.virtual_pipeline=2",
    ],
    "megatron CP=2": ["actor.strategy=megatron", "actor.megatron.context_parallel=2"],
}


def parallel_section(runner: Runner, work: Workload, model: dict[str, int], results: dict[str, Any]) -> None:
    """No-ref step with sequence parallel and rollout tensor parallel against plain data parallel on the
    same 2 ranks."""
    short = replace(work, steps=3, ranks=2)
    results["runs"]["parallel/dp2"] = runner.tandem("parallel/dp2", short, VARIANTS["no-ref"])
    base = summarise(results["runs"]["parallel/dp2"], model, None)
    configs = {label: (short, extra) for label, extra in PARALLEL.items()}
    title = f"parallel layouts (no-ref, {short.label()}, 1 warm-up + 3 measured steps)"
    compare_runs(runner, model, results, "parallel", configs, ("fsdp2 DP=2, 2 ranks", base), title)


# A mixture-of-experts W1 (4 experts of W1's MLP per layer, 2 per token: twice the MLP arithmetic of dense W1)
# on 2 ranks: FSDP2 data parallel, and megatron expert parallel without and with tensor parallel.
MOE_MODEL = {"num_experts": 4, "experts_per_token": 2}
MOE = {
    "fsdp2 DP=2, MoE": [],
    "megatron EP=2, MoE": ["actor.strategy=megatron", "actor.megatron.expert_parallel=2"],
    "megatron TP2+SP, EP=2, MoE": [
        "actor.strategy=megatron",
        "actor.megatron.tensor_parallel=2",
        "actor.megatron.sequence_parallel=true",
        "actor.megatron.expert_parallel=2",
    ],
}


def moe_section(runner: Runner, work: Workload, results: dict[str, Any]) -> None:
    """No-ref step of the MoE W1 on 2 ranks (FSDP2 DP=2, megatron EP=2, TP=2 + SP + EP=2) against dense W1 on
    FSDP2 DP=2 (the parallel section's base run)."""
    from tandem.models.tiny import save_tiny

    short = replace(work, steps=3, ranks=2)
    if "parallel/dp2" not in results["runs"]:
        results["runs"]["parallel/dp2"] = runner.tandem("parallel/dp2", short, VARIANTS["no-ref"])
    base = summarise(results["runs"]["parallel/dp2"], model_numbers(runner.folder), None)
    folder = save_tiny(runner.workdir / "moe-model", **MOE_MODEL)
    moe_runner = Runner(runner.workdir, folder, runner.data, runner.prompts)
    configs = {label: (short, extra) for label, extra in MOE.items()}
    title = f"mixture of experts (no-ref, {short.label()}, 1 warm-up + 3 measured steps)"
    compare_runs(
        moe_runner, model_numbers(folder), results, "moe", configs, ("dense fsdp2 DP=2", base), title
    )


def compare_runs(
    runner: Runner,
    model: dict[str, int],
    results: dict[str, Any],
    key: str,
    configs: dict[str, tuple[Workload, list[str]]],
    base: tuple[str, dict[str, float]],
    title: str,
) -> None:
    """A no-ref run per config, each row's step against `base` (label, summary); printed under `title`."""
    rows = {base[0]: base[1]}
    for label, (config_work, extra) in configs.items():
        name = f"{key}/" + label.replace(" ", "-").replace(",", "").replace("=", "")
        results["runs"][name] = runner.tandem(name, config_work, [*VARIANTS["no-ref"], *extra])
        rows[label] = summarise(results["runs"][name], model, None)
    results[key] = {
        label: {
            "step": r["step"],
            "step_ratio": r["step"] / base[1]["step"],
            "train": r["train"],
            "generate": r["generate"],
            "sync": r["weight_sync"],
        }
        for label, r in rows.items()
    }
    print(f"\n{title}")
    print(f"{'config':<28}{'step s':>10}{'x first':>10}{'train s':>10}{'generate s':>12}{'sync s':>10}")
    for label, r in results[key].items():
        cells = f"{r['step']:>10.3f}{r['step_ratio']:>10.2f}{r['train']:>10.3f}{r['generate']:>12.3f}{r['sync']:>10.3f}"
        print(f"{label:<28}{cells}")


# The no-ref step with the rollout engine in a pool of its own (issue 17): the 2 cores split 1 + 1.
LAYOUTS = {
    "separate, synchronous": ["rollout.layout=separate", "trainer.cpus_per_worker=1"],
    "separate, one_step_off": [
        "rollout.layout=separate",
        "trainer.cpus_per_worker=1",
        "trainer.async_mode=one_step_off",
    ],
}


def layouts_section(runner: Runner, work: Workload, results: dict[str, Any]) -> None:
    """No-ref samples/s with the rollout in its own pool (synchronous, one-step-off) against the hybrid
    main run. The step is timed by the controller's wall clock from the step's start to the workers'
    report (timing_s/step_wall), which waits for a generation still in flight."""
    rows = {"hybrid (main run), 1 rank of 2 CPUs": main_run(runner, work, "no-ref", results)}
    for label, extra in LAYOUTS.items():
        name = "layouts/" + label.replace(" ", "-").replace(",", "")
        results["runs"][name] = runner.tandem(name, work, [*VARIANTS["no-ref"], *extra])
        rows[label] = results["runs"][name]
    table = {}
    for label, run in rows.items():
        measured = run["steps"][1:]
        wall = statistics.median(m["timing_s/step_wall"] for m in measured)
        table[label] = {
            "step_wall": wall,
            "samples_per_s": statistics.median(m["perf/samples"] for m in measured) / wall,
            # one_step_off: the generation reported at a step is the next step's (none at the last)
            "generate": statistics.median(
                m["timing_s/generate"] for m in measured if "timing_s/generate" in m
            ),
            "update": statistics.median(m.get("timing_s/update_actor", 0.0) for m in measured),
            "weight_sync": statistics.median(m.get("timing_s/weight_sync", 0.0) for m in measured),
            "staleness": statistics.median(m.get("async/staleness_mean", 0.0) for m in measured),
        }
    base = next(iter(table.values()))["samples_per_s"]
    for row in table.values():
        row["x_hybrid"] = row["samples_per_s"] / base
    results["layouts"] = table
    print(f"\nlayouts (no-ref, 1 warm-up + {work.steps} measured steps; medians)")
    head = ("step wall s", "samples/s", "x hybrid", "generate s", "update s", "sync s", "stale")
    print(f"{'layout':<40}" + "".join(f"{h:>12}" for h in head))
    for label, r in table.items():
        cells = (r["step_wall"], r["samples_per_s"], r["x_hybrid"], r["generate"], r["update"])
        line = "".join(f"{v:>12.3f}" for v in cells)
        print(f"{label:<40}{line}{r['weight_sync']:>12.3f}{r['staleness']:>12.1f}")


# Model sizes (issue 20): W1's shape, 8x its parameters, and ~100 M; the same tokenizer, prompts and reward.
SIZES = {  # save_tiny's model keywords
    "W1 (3.2 M)": {},
    "8x (25 M)": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_layers": 8,
        "num_heads": 8,
        "num_kv_heads": 4,
    },
    "100M (101 M)": {
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_layers": 8,
        "num_heads": 16,
        "num_kv_heads": 8,
    },
}
# "before": the trainer as it was before issue 20 (AdamW's plain loop; the full logits, which these models'
# 320-entry vocabulary keeps anyway).
BEFORE = ["actor.optim.implementation=for_loop", "actor.fsdp.lm_head_chunk_tokens=null"]


def sizes_section(runner: Runner, work: Workload, results: dict[str, Any]) -> None:
    """No-ref W1 workload per model size, before and after issue 20's trainer changes: every phase,
    achieved FLOP/s and MFU of generation and training against the matmul peaks measured here."""
    import torch

    short = replace(work, steps=2)
    # bf16 at 1024 and best of 2: a CPU without native bf16 runs it hundreds of times slower than fp32
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16, 1024, 2)}
    results["sizes"] = {"peaks": peaks, "rows": {}}
    size_runs(runner, short, results, "before", BEFORE)
    size_runs(runner, short, results, "after", [])
    for size in SIZES:
        model = model_numbers(runner.workdir / ("model-" + size.split()[0]))
        for when in ("before", "after"):
            s = summarise(results["runs"][f"sizes/{size.split()[0]}-{when}"], model, None)
            gen_flops = forward_flops(model, s["generated_tokens"], s["context"])
            train_flops = s["flops"] - gen_flops
            s["gen_flops_per_s"] = gen_flops / s["generate"]
            s["train_flops_per_s"] = train_flops / s["train"]
            results["sizes"]["rows"][f"{size}, {when}"] = {"params": model["params"], **s}
    print_sizes(results["sizes"], short)


def size_runs(
    runner: Runner,
    work: Workload,
    results: dict[str, Any],
    when: str,
    extra: list[str],
    sizes: tuple[str, ...] = tuple(SIZES),
) -> None:
    """One no-ref run per model size (`sizes/<size>-<when>`), unless this invocation has it already."""
    from tandem.models.tiny import save_tiny

    for size in sizes:
        kwargs = SIZES[size]
        name = f"sizes/{size.split()[0]}-{when}"
        if name not in results["runs"]:
            folder = save_tiny(runner.workdir / ("model-" + size.split()[0]), **kwargs)
            overrides = [*VARIANTS["no-ref"], f"actor.model_path={folder}", *extra]
            results["runs"][name] = runner.tandem(name, work, overrides)


# LoRA (issue 19): full training against r=8 adapters on every linear, the rollout synced with the merged
# weights or with the adapters alone (vLLM serving them on its base weights), on the two smaller sizes.
LORA = {
    "after": ("full", []),
    "lora-merged": ("LoRA r8, merged", ["actor.lora.rank=8"]),
    "lora-adapter": ("LoRA r8, adapter", ["actor.lora.rank=8", "actor.lora.rollout_sync=adapter"]),
}
LORA_SIZES = ("W1 (3.2 M)", "8x (25 M)")


def lora_section(runner: Runner, work: Workload, results: dict[str, Any]) -> None:
    """No-ref step per model size: full training, LoRA synced as merged weights, LoRA synced as adapters."""
    sync_section(runner, replace(work, steps=2), results, "lora", LORA, LORA_SIZES, "LoRA")


# Shard-only weight sync (issue 18): one vLLM engine over 2 ranks, each rank receiving whole tensors or only
# the part of each its half of the engine keeps (rollout.shard_weight_sync), on the two smaller sizes.
TP_SYNC = {
    "tp2-whole": ("rollout TP=2, whole", ["rollout.tensor_parallel=2", "rollout.shard_weight_sync=false"]),
    "tp2-shard": ("rollout TP=2, shard-only", ["rollout.tensor_parallel=2"]),
}


def tp_sync_section(runner: Runner, work: Workload, results: dict[str, Any]) -> None:
    """No-ref step per model size on 2 ranks with a rollout TP=2 engine: whole-tensor against shard-only sync."""
    short = replace(work, steps=2, ranks=2)
    sync_section(runner, short, results, "tp_sync", TP_SYNC, LORA_SIZES, "rollout TP=2 weight sync")


def sync_section(
    runner: Runner,
    work: Workload,
    results: dict[str, Any],
    key: str,
    configs: dict[str, tuple[str, list[str]]],
    sizes: tuple[str, ...],
    title: str,
) -> None:
    """One no-ref run per model size and config (`configs`: run name -> (label, overrides)); a row each with
    the step, its generate / sync / train phases and the MB one rank received per sync."""
    rows = {}
    print(f"\n{title} (no-ref, {work.label()}, 1 warm-up + {work.steps} measured steps)")
    header = ("step s", "generate s", "sync s", "sync MB", "train s")
    print(f"{'model, config':<40}" + "".join(f"{h:>12}" for h in header))
    for when, (_, extra) in configs.items():
        size_runs(runner, work, results, when, extra, sizes=sizes)
    for size in sizes:
        for when, (label, _) in configs.items():
            run = results["runs"][f"sizes/{size.split()[0]}-{when}"]
            s = summarise(run, model_numbers(runner.workdir / ("model-" + size.split()[0])), None)
            megabytes = statistics.median(m["weight_sync/bytes"] for m in run["steps"][1:]) / 1e6
            rows[f"{size}, {label}"] = {
                **{k: s[k] for k in ("step", "generate", "weight_sync", "train")},
                "mb": megabytes,
            }
            r = rows[f"{size}, {label}"]
            cells = (r["step"], r["generate"], r["weight_sync"], r["mb"], r["train"])
            print(f"{size + ', ' + label:<40}" + "".join(f"{v:>12.3f}" for v in cells))
    results[key] = rows


def compile_section(runner: Runner, work: Workload, results: dict[str, Any]) -> None:
    """fsdp.torch_compile per model size: the training phase eager and compiled, and the compile time
    (timing_s/compile, paid once before the first step, not in any step's time)."""
    short = replace(work, steps=2)
    size_runs(runner, short, results, "after", [])
    size_runs(runner, short, results, "compiled", ["actor.fsdp.torch_compile=true"])
    rows = {}
    print(f"\nfsdp.torch_compile (no-ref, {short.label()}, 1 warm-up + {short.steps} measured steps)")
    print(f"{'model':<16}" + "".join(f"{h:>14}" for h in ("train s", "compiled s", "speed-up", "compile s")))
    for size in SIZES:
        eager, compiled = (results["runs"][f"sizes/{size.split()[0]}-{w}"] for w in ("after", "compiled"))
        train = [statistics.median(phases(m)["train"] for m in run["steps"][1:]) for run in (eager, compiled)]
        seconds = compiled["steps"][0]["timing_s/compile"]
        rows[size] = {"train_eager": train[0], "train_compiled": train[1], "compile_s": seconds}
        cells = (train[0], train[1], train[0] / train[1], seconds)
        print(f"{size:<16}" + "".join(f"{v:>14.2f}" for v in cells))
    results["compile"] = rows


def print_sizes(sizes: dict[str, Any], work: Workload) -> None:
    peaks = sizes["peaks"]
    print(
        f"\nmodel sizes (no-ref, {work.label()}, 1 warm-up + {work.steps} measured steps; matmul peaks here: "
        f"fp32 {peaks['fp32'] / 1e9:.0f}, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s)"
    )
    head = (
        "step s",
        "generate s",
        "train s",
        "gen GF/s",
        "train GF/s",
        "gen MFU%",
        "train MFU%",
        "bf16 MFU%",
        "RSS GiB",
    )
    print(f"{'model, trainer':<24}" + "".join(f"{h:>11}" for h in head))
    for label, r in sizes["rows"].items():
        cells = (
            r["step"],
            r["generate"],
            r["train"],
            r["gen_flops_per_s"] / 1e9,
            r["train_flops_per_s"] / 1e9,
            100 * r["gen_flops_per_s"] / peaks["fp32"],
            100 * r["train_flops_per_s"] / peaks["fp32"],
            100 * r["train_flops_per_s"] / peaks["bf16"] if peaks["bf16"] > peaks["fp32"] else float("nan"),
            r["peak_rss_gib"],
        )
        print(f"{label:<24}" + "".join(f"{v:>11.2f}" for v in cells))
    print(
        "MFU = achieved model FLOP/s / the matmul peak (train: against fp32, and against bf16 where bf16 is the "
        "faster: nan where this CPU has no native bf16)"
    )


# Sample dumps on and off, each twice, alternating (off, on, off, on) so slow drift of the machine hits both.
DUMP_CONFIGS = {
    "dumps off": [],
    "dumps on": ["trainer.rollout_data_dir={out}/rollouts"],
    "dumps on, trainer log-probs": [
        "trainer.rollout_data_dir={out}/rollouts",
        "actor.old_log_probs_from_update=false",
    ],
    "trainer log-probs, dumps off": ["actor.old_log_probs_from_update=false"],
}


def dumps_section(runner: Runner, work: Workload, results: dict[str, Any]) -> None:
    """No-ref step time with trainer.rollout_data_dir on and off: the step's part of the dump
    (timing_s/dump), and the step itself while the background writer decodes and writes the previous
    step's samples. 'trainer log-probs': the old-log-prob pass on, so each row also carries its tokens
    and per-token mismatch (the heaviest rows); compared with the same pass and no dumps."""
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in DUMP_CONFIGS}
    for repeat in range(2):
        for label, extra in DUMP_CONFIGS.items():
            name = f"dumps/{label.replace(' ', '-').replace(',', '')}-{repeat}"
            out = runner.workdir / "runs" / name.replace("/", "-")
            run = runner.tandem(
                name, replace(work, steps=4), [*VARIANTS["no-ref"], *(e.format(out=out) for e in extra)]
            )
            results["runs"][name] = run
            rows[label] += run["steps"][1:]
    results["dumps"] = {
        label: {
            "step": statistics.median(m["timing_s/step"] for m in steps),
            "step_wall": statistics.median(m["timing_s/step_wall"] for m in steps),
            "dump": statistics.median(m.get("timing_s/dump", 0.0) for m in steps),
            "steps": len(steps),
        }
        for label, steps in rows.items()
    }
    print("\nSample dumps (no-ref, medians over 2 runs x 4 measured steps)")
    print(f"{'config':<32}{'step s':>10}{'step_wall s':>13}{'dump s':>10}")
    for label, r in results["dumps"].items():
        print(f"{label:<32}{r['step']:>10.3f}{r['step_wall']:>13.3f}{r['dump']:>10.4f}")


def main_run(runner: Runner, work: Workload, variant: str, results: dict[str, Any]) -> dict[str, Any]:
    """The main run of a variant, trained once and shared by the sections."""
    name = f"main/{variant}"
    if name not in results["runs"]:
        results["runs"][name] = runner.tandem(name, work, VARIANTS[variant])
    return results["runs"][name]


def say(line: str) -> None:
    print(f"[w1] {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

"""Training throughput of one RL update on one GPU (issue 33): Tandem's FSDP2 engine against a plain loop.

    python bench/gpu_train.py [--sizes 0.5B,1.5B,3B] [--attn auto,sdpa] [--steps 3] [--profile] [--json out.json]
    python bench/gpu_train.py --device cpu --sizes tiny --steps 1 --profile     (a smoke run of the script)

The workload, as issue 33 measured it: 64 sequences, a 256-token prompt and a long-tailed response
(log-normal, median 600, sigma 1, capped so a sequence is <= 4096 tokens; ~70 k tokens a step, printed),
a policy-gradient loss (-A x log-prob, token mean) on the response tokens, one AdamW step, gradients
clipped to 1. Models: Qwen2.5 0.5 B / 1.5 B / 3 B shapes with random weights and the real 151 936-entry
vocabulary, built in code (tandem.models.tiny, tied embeddings as Qwen2.5's); 3 B with activation
checkpointing in both loops.

- tandem <attn>: the FSDP2 engine as the actor runs it: bf16 compute over fp32 master weights, packed
  micro-batches under a 16 k-token budget, the chunked LM head (auto), `actor.fsdp.attn_implementation`
  = <attn> (engine/attention.py), the decoder layers and the head's chunk arithmetic compiled on CUDA
  (fsdp.torch_compile=auto, fsdp.lm_head_compile=auto).
  `--variants` adds rows of tandem <first attn> with one setting changed (VARIANTS): `eager-layers`
  (fsdp.torch_compile=false), `compile` (fsdp.torch_compile=true: auto's choice on CUDA, forced on a CPU),
  `liger` (fsdp.liger; the liger-kernel package), `eager-head` (lm_head_compile=false), `head-chunk=N`
  (lm_head_chunk_tokens=N instead of auto's 883 on CUDA).
- plain: fp32 parameters under autocast bf16, fused AdamW, 4 rows a micro-batch padded to their own longest
  row, the full logits, log-softmax in float32.

Each configuration runs in a child process of its own (fresh CUDA memory statistics): warm-up steps (one for
the plain loop and eager layers, two where the layers may be compiled: a packing the start-up warm-up did not
foresee compiles on first use) and --steps measured ones. Per row: the median step, tokens/s, MFU (model FLOPs of
the update, engine/flops.py's formula: 3 x (2 N T + 4 L H sum n^2), over the step time and the GPU's dense
bf16 peak), the peak allocated memory, and the ratio to the plain loop. --profile adds one profiled step per
configuration: device time by kind (matmul, attention, elementwise and copies, other) and the top kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 151_936
SHAPES = {  # Qwen2.5's published shapes (config.json of each), as save_tiny's model keywords
    "0.5B": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_layers": 24,
        "num_heads": 14,
        "num_kv_heads": 2,
    },
    "1.5B": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_layers": 28,
        "num_heads": 12,
        "num_kv_heads": 2,
    },
    "3B": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_layers": 36,
        "num_heads": 16,
        "num_kv_heads": 2,
    },
    # the smoke run's: W1's shape with a small vocabulary
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_layers": 4,
        "num_heads": 4,
        "num_kv_heads": 2,
    },
}
CHECKPOINTED = {"3B"}  # activation checkpointing, both loops (without it 3 B's plain loop does not fit)
PLAIN_ROWS = 4  # rows per micro-batch of the plain loop
# kernel name -> kind, first match wins (CUDA kernel names of cuBLAS / CUTLASS, flash and cuDNN attention)
KINDS = [
    ("attention", re.compile(r"flash|fmha|attention|attn|flex|cudnn|sdpa", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|xmma|sm\d+_|cublas|matmul|\bmm\b|addmm", re.I)),
    # on the CPU every other aten operator is elementwise work (or the optimizer's, which is too)
    (
        "elementwise",
        re.compile(r"elementwise|vectorized|unrolled|reduce|copy|cast|softmax|norm|cat|index|^aten::", re.I),
    ),
]


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


# ---------------------------------------------------------------------------- the workload
def workload(args: dict):
    """The step's batch: left-aligned prompt ++ right-padded response per row, advantages per response token."""
    import numpy as np
    import torch

    from tandem.batch import Batch

    rng = np.random.default_rng(args["seed"])
    prompt, longest = args["prompt"], args["longest"]
    responses = rng.lognormal(np.log(args["median"]), args["sigma"], args["sequences"])
    responses = np.clip(np.round(responses), 1, longest - prompt).astype(int)
    width = int(responses.max())
    response_mask = torch.from_numpy(np.arange(width)[None, :] < responses[:, None]).long()
    mask = torch.cat([torch.ones(len(responses), prompt, dtype=torch.long), response_mask], dim=1)
    gen = torch.Generator().manual_seed(args["seed"])
    ids = torch.randint(0, args["vocab"], mask.shape, generator=gen) * mask
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:],
            "response_mask": response_mask,
            "advantages": torch.randn(response_mask.shape, generator=gen),
        }
    )


# ---------------------------------------------------------------------------- one configuration (child)
def child(args: dict) -> dict:
    import torch
    import torch.distributed as dist

    from tandem.engine.flops import ModelFlops, peak_flops

    device = torch.device(args["device"])
    batch = workload(args)
    tokens = float(batch["response_mask"].sum())
    if args["kind"] == "plain":
        step = plain_loop(args, batch, device, tokens)
    else:
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = Path(args["folder"]) / f"store-{args['label']}-{time.time_ns()}"
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
        step = tandem_engine(args, batch, device, tokens)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args["warmup"] + args["steps"]):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    measured = times[args["warmup"] :]
    seconds = statistics.median(measured)
    flops = 3 * ModelFlops.from_folder(args["model"]).forward(batch["attention_mask"])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = peak_flops(device, dtype)
    result = {
        "step_s": seconds,
        "steps_s": measured,
        "tokens": int(batch["attention_mask"].sum()),
        "tokens_per_s": int(batch["attention_mask"].sum()) / seconds,
        "mfu": flops / (seconds * peak) if peak else float("nan"),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"),
        "warmup_s": times[: args["warmup"]],
    }
    if args["profile"]:
        result["profile"] = profile(step, device)
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


def tandem_engine(args: dict, batch, device, tokens: float):
    from tandem.algos import agg_loss
    from tandem.config.schema import FSDPConfig, OptimConfig
    from tandem.engine import EngineSpec, FSDPEngine
    from tandem.roles.common import response_log_probs

    cuda = device.type == "cuda"
    engine = FSDPEngine(
        EngineSpec(
            model_path=args["model"],
            head="lm",
            device=device,
            optim=OptimConfig(lr=1e-6),
            fsdp=FSDPConfig(
                param_dtype="bfloat16" if cuda else "float32",
                attn_implementation=args["attn"],
                **args["fsdp"],
            ),
            grad_clip=1.0,
            total_training_steps=100,
            activation_checkpointing=args["checkpointing"],
            packing=True,
            max_tokens_per_micro_batch=args["budget"],
        )
    )
    print(f"[gpu_train] {args['label']}: attention {engine.config._attn_implementation}", file=sys.stderr)

    def loss_fn(output, micro):
        log_probs, _ = response_log_probs(output, micro["responses"], 1.0, False)
        loss = agg_loss(-micro["advantages"] * log_probs, micro["response_mask"], global_num_tokens=tokens)
        return loss, {}

    def step() -> None:
        engine.train_step(batch, loss_fn, len(batch))

    return step


def plain_loop(args: dict, batch, device, tokens: float):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    cuda = device.type == "cuda"
    model = AutoModelForCausalLM.from_pretrained(
        args["model"], dtype=torch.float32, attn_implementation="sdpa"
    )
    model.to(device).train()
    model.config.use_cache = False
    if args["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda)
    prompt = args["prompt"]
    lengths = batch["attention_mask"].sum(-1)

    def step() -> None:
        for start in range(0, len(batch), PLAIN_ROWS):
            rows = slice(start, start + PLAIN_ROWS)
            width = int(lengths[rows].max())
            ids = batch["input_ids"][rows, :width].to(device)
            mask = batch["attention_mask"][rows, :width].to(device)
            response = width - prompt
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = model(input_ids=ids, attention_mask=mask).logits
            log_probs = F.log_softmax(logits[:, prompt - 1 : width - 1].float(), dim=-1)
            picked = log_probs.gather(-1, ids[:, prompt:, None]).squeeze(-1)
            weights = batch["advantages"][rows, :response].to(device) * batch["response_mask"][
                rows, :response
            ].to(device)
            loss = -(weights * picked).sum() / tokens
            loss.backward()
            del logits, log_probs, picked, loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def profile(step, device) -> dict:
    """One profiled step: device time by kind and the top kernels (self time)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities, record_shapes=True) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    events = [
        e for e in prof.key_averages() if (e.self_device_time_total if cuda else e.self_cpu_time_total) > 0
    ]
    timed = sorted(
        ((e.key, (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6) for e in events),
        key=lambda item: -item[1],
    )
    if cuda:  # kernels only: operator rows would count their kernels twice
        timed = [(name, s) for name, s in timed if not name.startswith("aten::")]
    else:  # on the CPU the operators are the work
        timed = [(name, s) for name, s in timed if name.startswith("aten::")]
    total = sum(s for _, s in timed) or 1.0
    by_kind: dict[str, float] = {}
    for name, seconds in timed:
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + seconds
    return {
        "total_s": total,
        "by_kind": {k: v / total for k, v in sorted(by_kind.items(), key=lambda item: -item[1])},
        "top": [(name[:90], seconds / total) for name, seconds in timed[:12]],
        "copies": copies(prof.events(), cuda, total),
    }


ELEMENT_BYTES = {
    "float": 4,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "double": 8,
    "long int": 8,
    "int": 4,
    "bool": 1,
}


def copies(events, cuda: bool, total: float) -> list[tuple[str, float, float]]:
    """Issue 33 item 4, where the copies come from: every aten::copy_ of the step (each cast and copy; a
    `.to()` runs one) grouped by its source and destination dtype and shape: (what, GiB moved (read +
    written), share of the step's kernel time), the largest first. The shape names the tensor: [chunk, vocab]
    is the LM head's, [1, n] / [n] of a layer's parameter count FSDP2's unshard (copy-in / copy-out) or its
    gradient's reduction, [rows, tokens, hidden] the activations."""
    groups: dict[str, list[float]] = {}
    for event in events:
        # torch 2.11's profiler events have no input_dtypes (the lent GPU machine's torch): "?" counts 4 bytes
        shapes, dtypes = event.input_shapes, getattr(event, "input_dtypes", None) or ["?", "?"]
        if event.name != "aten::copy_" or len(shapes) < 2 or not shapes[0]:
            continue
        numel = math.prod(shapes[0])
        moved = numel * (ELEMENT_BYTES.get(dtypes[1], 4) + ELEMENT_BYTES.get(dtypes[0], 4))
        what = f"{dtypes[1]} -> {dtypes[0]} {list(shapes[0])}".replace("c10::", "")
        seconds = (event.device_time_total if cuda else event.cpu_time_total) / 1e6
        group = groups.setdefault(what, [0.0, 0.0])
        group[0] += moved / 2**30
        group[1] += seconds / total
    return sorted(((w, g, t) for w, (g, t) in groups.items()), key=lambda row: -row[1])[:8]


# ---------------------------------------------------------------------------- the parent
def run_child(spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, cwd=ROOT
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def variant_fsdp(variant: str) -> dict:
    """The FSDPConfig settings of a --variants entry."""
    name, _, value = variant.partition("=")
    if name == "compile":
        return {"torch_compile": True}
    if name == "eager-layers":
        return {"torch_compile": False}
    if name == "liger":
        return {"liger": True}
    if name == "eager-head":
        return {"lm_head_compile": False}
    if name == "head-chunk" and value.isdigit():
        return {"lm_head_chunk_tokens": int(value)}
    raise SystemExit(
        f"--variants: unknown entry {variant!r}; use eager-layers, compile, liger, eager-head, head-chunk=N"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.5B,1.5B,3B", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--attn", default="auto,sdpa", help="actor.fsdp.attn_implementation values to run")
    parser.add_argument(
        "--variants",
        default="",
        help="comma-separated rows of tandem <first attn> with one setting changed: "
        "eager-layers, compile, liger, eager-head, head-chunk=N",
    )
    parser.add_argument("--no-plain", action="store_true", help="skip the plain loop")
    parser.add_argument("--steps", type=int, default=3, help="measured steps after the warm-up")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--median", type=float, default=600)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--longest", type=int, default=4096, help="prompt + response tokens at most")
    parser.add_argument("--budget", type=int, default=16384, help="tokens per packed micro-batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="one profiled step per configuration")
    parser.add_argument("--json", help="also write every number to this file (after each configuration)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("bench/gpu_train.py needs a CUDA device (--device cpu for a smoke run of the script)")
        print(f"[gpu_train] {torch.cuda.get_device_name()}, torch {torch.__version__}", file=sys.stderr)
    from tandem.models.tiny import save_tiny

    folder = Path(tempfile.mkdtemp(prefix="tandem-gpu-train-"))
    skip = ("child", "sizes", "attn", "json", "no_plain", "variants")
    base = {k: v for k, v in vars(args).items() if k not in skip}
    results: dict[str, dict[str, dict]] = {}
    for size in args.sizes.split(","):
        vocab = 4096 if size == "tiny" else VOCAB
        model = save_tiny(
            folder / size, vocab_size=vocab, max_position_embeddings=max(4096, args.longest), **SHAPES[size]
        )
        plan = [] if args.no_plain else [("plain", {"kind": "plain", "attn": "sdpa", "fsdp": {}})]
        plan += [(f"tandem {a}", {"kind": "tandem", "attn": a, "fsdp": {}}) for a in args.attn.split(",")]
        first = args.attn.split(",")[0]
        for variant in filter(None, args.variants.split(",")):
            plan.append(
                (
                    f"tandem {first} {variant}",
                    {"kind": "tandem", "attn": first, "fsdp": variant_fsdp(variant)},
                )
            )
        results[size] = {}
        for label, extra in plan:
            spec = {
                **base,
                **extra,
                "label": f"{size}-{label.replace(' ', '-')}",
                "model": str(model),
                "folder": str(folder),
                "vocab": vocab,
                "checkpointing": size in CHECKPOINTED,
                "warmup": 2
                if extra["kind"] == "tandem" and extra["fsdp"].get("torch_compile") is not False
                else 1,
            }
            print(f"[gpu_train] {size} {label} ...", file=sys.stderr, flush=True)
            try:
                results[size][label] = run_child(spec)
            except RuntimeError as error:  # one configuration's failure is a row of the report
                results[size][label] = {"error": str(error)}
                print(f"[gpu_train] {size} {label} FAILED:\n{error}", file=sys.stderr, flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
        report(size, results[size], args)


def report(size: str, rows: dict[str, dict], args) -> None:
    done = {label: r for label, r in rows.items() if "error" not in r}
    plain = done.get("plain", {}).get("step_s")
    tokens = next(iter(done.values()), {}).get("tokens", 0)
    print(f"\n{size}: {args.sequences} sequences, {tokens} tokens a step ({args.device})")
    print(f"{'config':<28}{'step s':>9}{'tokens/s':>11}{'MFU':>7}{'peak GiB':>10}{'vs plain':>10}")
    for label, r in rows.items():
        if "error" in r:
            print(f"{label:<28}failed (above)")
            continue
        ratio = f"{plain / r['step_s']:.2f}x" if plain else "-"
        print(
            f"{label:<28}{r['step_s']:>9.3f}{r['tokens_per_s']:>11.0f}{r['mfu']:>7.3f}{r['peak_gib']:>10.1f}{ratio:>10}"
        )
    for label, r in done.items():
        if "profile" in r:
            p = r["profile"]
            kinds = ", ".join(f"{k} {100 * v:.0f} %" for k, v in p["by_kind"].items())
            print(f"  profile of {label} ({p['total_s']:.2f} s of kernels): {kinds}")
            for name, share in p["top"][:8]:
                print(f"    {100 * share:5.1f} %  {name}")
            moved = sum(gib for _, gib, _ in p["copies"])
            print(f"  copies of {label} (the 8 largest groups, {moved:.1f} GiB moved):")
            for what, gib, share in p["copies"]:
                print(f"    {gib:7.2f} GiB {100 * share:5.1f} %  {what}")


if __name__ == "__main__":
    main()

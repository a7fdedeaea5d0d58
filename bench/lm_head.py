"""The LM head with a real vocabulary (issue 20): full logits against `actor.fsdp.lm_head_chunk_tokens`.

    .venv/bin/python bench/lm_head.py [--vocab 151936] [--rows 8] [--length 512] [--chunks 256,1024,4096]
    .venv/bin/python bench/lm_head.py --head-only 1024 --chunks 220     (the head alone, eager and compiled)

A Qwen2 of W1's shape (hidden 256, 4 layers, 4 heads / 2 KV heads, tied embeddings, fp32) with a
Qwen-sized vocabulary (151 936 entries: 39 M of its 42 M parameters are the embedding / head), on the
FSDP2 engine, one rank of all the cores. One micro-batch of --rows sequences of --length tokens: a
prompt of a quarter and a response of the rest (every token real). Per configuration, in a child
process of its own:
  forward   the old-log-prob pass: engine.forward with roles/common.response_log_probs (log-probs and
            entropy at T = 1), no gradient
  update    engine.train_step with a PPO-like loss of the same numbers (-A x log-prob, token mean, an
            entropy bonus) and one AdamW step
Seconds: median of --repeats passes after one warm-up. Peak memory: the process's peak RSS read when
the engine is built (the baseline: model and loading), after the forwards and after the updates; the
table shows each peak's growth over the baseline: what the forward needs, and what the update needs
(its gradients and AdamW's two moments included: 3 x 4 bytes x 42 M parameters, about 0.5 GiB).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(args: dict) -> dict:
    """One configuration in this (fresh) process; the numbers as a dict."""
    import torch
    import torch.distributed as dist

    from tandem.algos import agg_loss
    from tandem.batch import Batch
    from tandem.config.schema import FSDPConfig, OptimConfig
    from tandem.engine import EngineSpec, FSDPEngine
    from tandem.roles.common import response_log_probs

    store = Path(args["folder"]) / f"store-{args['label']}"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    rows, length = args["rows"], args["length"]
    prompt = length // 4
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, args["vocab"], (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    batch = Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": torch.arange(length).expand(rows, length).clone(),
            "responses": ids[:, prompt:],
            "response_mask": mask[:, prompt:],
            "advantages": torch.randn(rows, length - prompt, generator=gen),
        }
    )
    engine = FSDPEngine(
        EngineSpec(
            model_path=args["model"],
            head="lm",
            device=torch.device("cpu"),
            optim=OptimConfig(lr=1e-6),
            fsdp=FSDPConfig(lm_head_chunk_tokens=args["chunk"], lm_head_compile=args["compiled"]),
            grad_clip=1.0,
            total_training_steps=100,
            packing=True,
        )
    )
    tokens = float(batch["response_mask"].sum())

    def stats_fn(output, micro):
        log_probs, entropy = response_log_probs(output, micro["responses"], 1.0, True)
        return {"log_probs": log_probs, "entropy": entropy}

    def loss_fn(output, micro):
        log_probs, entropy = response_log_probs(output, micro["responses"], 1.0, True)
        m = micro["response_mask"]
        loss = agg_loss(-micro["advantages"] * log_probs, m, global_num_tokens=tokens)
        return loss - 0.001 * agg_loss(entropy, m, global_num_tokens=tokens), {}

    runs = 1 + args["repeats"]  # the first is a warm-up
    base = peak_rss_mb()
    forward = timed_runs(lambda: engine.forward(batch, stats_fn, rows), runs)[1:]
    after_forward = peak_rss_mb()
    update = timed_runs(lambda: engine.train_step(batch, loss_fn, rows), runs)[1:]
    after_update = peak_rss_mb()
    first = engine.forward(batch, stats_fn, rows)
    dist.destroy_process_group()
    return {
        "forward_s": statistics.median(forward),
        "update_s": statistics.median(update),
        "base_mb": base,
        "forward_peak_mb": after_forward - base,
        "update_peak_mb": after_update - base,
        "log_probs_sum": float(first["log_probs"].double().sum()),
        "entropy_sum": float(first["entropy"].double().sum()),
    }


def head_only(vocab: int, rows: int, hidden_size: int, chunk: int, repeats: int) -> None:
    """The head alone, no model: `HeadRows.stats` (log-probs and entropy) on random hidden states and weight,
    eager and compiled, in bf16 and float32; seconds of the no-grad forward and of forward + backward."""
    import torch

    from tandem.engine.lm_head import ChunkedHead, HeadRows

    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    print(f"\nHeadRows.stats alone: {rows} rows, hidden {hidden_size}, vocab {vocab}, chunks of {chunk}")
    print(f"{'dtype':<10}{'head':<10}{'forward s':>12}{'fwd+bwd s':>12}")
    for dtype in (torch.bfloat16, torch.float32):
        hidden = torch.randn(rows, hidden_size, generator=gen).to(dtype).requires_grad_()
        weight = (torch.randn(vocab, hidden_size, generator=gen) * 0.02).to(dtype).requires_grad_()
        for compiled in (False, True):
            rows_of = HeadRows(hidden, ChunkedHead(weight, None, chunk, compiled), 1.0)

            def forward(rows_of=rows_of):
                with torch.no_grad():
                    rows_of.stats(labels, entropy=True)

            def both(rows_of=rows_of):
                stats = rows_of.stats(labels, entropy=True)
                (stats["log_probs"].sum() + 0.01 * stats["entropy"].sum()).backward()

            seconds = []
            for fn in (forward, both):
                fn()  # warm-up (and, compiled, the compile)
                seconds.append(statistics.median(timed_runs(fn, repeats)))
            name = str(dtype).removeprefix("torch.")
            print(
                f"{name:<10}{'compiled' if compiled else 'eager':<10}{seconds[0]:>12.3f}{seconds[1]:>12.3f}"
            )


def timed_runs(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--chunks", default="256,1024,4096", help="lm_head_chunk_tokens values to compare")
    parser.add_argument(
        "--compiled", action="store_true", help="also each chunk size with actor.fsdp.lm_head_compile=true"
    )
    parser.add_argument("--repeats", type=int, default=1, help="measured passes after one warm-up")
    parser.add_argument("--json", help="also write every number to this file")
    parser.add_argument(
        "--head-only",
        type=int,
        metavar="ROWS",
        help="instead: HeadRows.stats alone on ROWS rows (hidden 896, the first --chunks), eager and compiled",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.head_only:
        head_only(args.vocab, args.head_only, 896, int(args.chunks.split(",")[0]), max(args.repeats, 3))
        return

    from tandem.models.tiny import save_tiny

    folder = Path(tempfile.mkdtemp(prefix="tandem-lm-head-"))
    model_dir = save_tiny(folder / "model", vocab_size=args.vocab, max_position_embeddings=4096)
    results = {}
    cases = [("full logits", None, False)]
    for c in args.chunks.split(","):
        cases.append((f"chunks of {c}", int(c), False))
        if args.compiled:
            cases.append((f"{c}, compiled", int(c), True))
    for label, chunk, compiled in cases:
        spec = {**vars(args), "label": label.replace(" ", "-").replace(",", ""), "folder": str(folder)}
        spec.update(chunk=chunk, compiled=compiled)
        spec["model"] = str(model_dir)
        spec.pop("child")
        print(f"[lm_head] {label} ...", file=sys.stderr, flush=True)
        out = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, cwd=ROOT
        )
        if out.returncode:
            raise SystemExit(f"{label} failed:\n{out.stderr[-3000:]}")
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
    tokens = args.rows * args.length
    print(
        f"\nLM head, vocab {args.vocab}, 1 micro-batch of {args.rows} x {args.length} tokens "
        f"({tokens} tokens, {args.rows * (args.length - args.length // 4)} response); full float32 logits of "
        f"the batch: {tokens * args.vocab * 4 / 2**20:.0f} MiB"
    )
    head = ("forward s", "update s", "fwd peak MiB", "upd peak MiB", "baseline MiB", "logp sum")
    print(f"{'head':<20}" + "".join(f"{h:>14}" for h in head))
    for label, r in results.items():
        cells = (r["forward_s"], r["update_s"], r["forward_peak_mb"], r["update_peak_mb"], r["base_mb"])
        print(f"{label:<20}" + "".join(f"{v:>14.2f}" for v in cells) + f"{r['log_probs_sum']:>14.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""A GRPO run through Ray on one device, end to end: the driver of bench/gpu_ray.sh.

    python bench/gpu_ray.py [--steps 3] [--out DIR] [key=value ...]

The tiny Qwen2 of the quickstart (tandem.models.tiny) and W1's `a+b=` prompts, built here; the grpo preset
(KL loss to a reference model), trainer.backend=ray, trainer.device=auto, one rank (trainer.workers_per_node=1)
holding the FSDP2 actor, the Hugging Face rollout (rollout.engine=hf) and the reference. Ray is started as
Tandem starts it (tandem.controller.init_ray: a local instance, no dashboard), before the trainer, so that
its resources and a probe task can be shown: one task asking for a GPU, as the worker will, that reports
what torch sees inside a Ray worker. Then the steps, each printed with its phases, the rollout/trainer
log-prob mismatch (rollout_mismatch/*) and the worker's peak GPU memory, which a worker reports only when it
computes on CUDA. Where this process sees a GPU, the run fails unless the workers used it.

Everything lands in <out>/gpu_ray.json. A failure prints its traceback, the tails of the workers' logs (the
run folder's logs/) and of Ray's own (session_latest/logs), and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

SHOWN = (  # per step, in this order, when present
    "timing_s/step",
    "timing_s/step_wall",
    "timing_s/generate",
    "timing_s/weight_sync",
    "timing_s/old_log_probs",
    "timing_s/ref_log_probs",
    "timing_s/update_actor",
    "score/mean",
    "response_length/mean",
    "actor/kl_loss",
    "perf/generated_tokens_per_s",
    "memory/peak_allocated_gib",
)


def say(line: str) -> None:
    print(f"[gpu_ray {time.strftime('%H:%M:%S')}] {line}", flush=True)


def probe() -> dict[str, Any]:
    """What torch sees in a Ray worker process (run as a Ray task)."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "pid": os.getpid(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_available": cuda,
        "device_name": torch.cuda.get_device_name(0) if cuda else None,
        "torch": torch.__version__,
    }


def overrides(args: argparse.Namespace, folder: Path, data: Path, out: Path) -> list[str]:
    """The grpo preset's overrides for this run; the command line's key=value come last and win."""
    prompts = args.prompts
    return [
        f"actor.model_path={folder}",
        f"data.train_files=[{data}]",
        "data.chat_template=none",
        "data.max_prompt_length=16",  # "99+99=" is 6 tokens
        f"data.max_response_length={args.tokens}",
        f"data.train_batch_size={prompts}",
        f"rollout.n={args.samples}",
        "rollout.temperature=1.0",
        "rollout.engine=hf",
        f"actor.ppo_mini_batch_size={prompts}",
        "actor.optim.lr=1e-5",
        "actor.use_kl_loss=true",
        "actor.kl_loss_coef=0.04",
        # the compile's warm-up is minutes of a three-minute budget; gpu_session.sh measures it
        "actor.fsdp.torch_compile=false",
        "trainer.backend=ray",
        f"trainer.device={args.device}",
        "trainer.nnodes=1",
        "trainer.workers_per_node=1",
        f"trainer.cpus_per_worker={args.cpus_per_worker}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.seed=1",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.save_final=false",
        "trainer.resume=disable",
        "trainer.loggers=[console,jsonl]",
        "trainer.progress_bar=false",
        f"trainer.output_dir={out}",
        "trainer.project_name=gpu_ray",
        "trainer.experiment_name=grpo",
        *args.overrides,
    ]


def tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"({error})"
    return "\n".join(text[-lines:])


def show_logs(run_logs: Path, ray_logs: Path | None) -> None:
    """The tails of the workers' logs (Tandem's run folder) and of Ray's processes (errors first)."""
    files = sorted(run_logs.glob("*.log")) if run_logs.is_dir() else []
    for path in files:
        print(f"\n---- {path} (last 60 lines)\n{tail(path, 60)}", flush=True)
    if ray_logs is None or not ray_logs.is_dir():
        print(f"\n(no Ray log folder at {ray_logs})", flush=True)
        return
    chosen = [p for p in ray_logs.glob("*.err") if p.stat().st_size > 0]
    chosen += [ray_logs / name for name in ("raylet.out", "gcs_server.out")]
    chosen += sorted(ray_logs.glob("runtime_env_agent*.log"))
    chosen += sorted(ray_logs.glob("python-core-worker-*.log"), key=lambda p: p.stat().st_mtime)[-2:]
    for path in dict.fromkeys(chosen):
        if path.is_file():
            print(f"\n---- {path} (last 25 lines)\n{tail(path, 25)}", flush=True)


def ray_log_dir() -> Path:
    """This Ray session's log folder (the newest session's if the session cannot be asked)."""
    try:
        import ray

        return Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    except Exception:
        return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "session_latest" / "logs"


def run(args: argparse.Namespace, report: dict[str, Any], workdir: Path) -> None:
    import ray
    import torch

    from tandem.config import load_config
    from tandem.controller import init_ray
    from tandem.data import make_rows, write_rows
    from tandem.models.tiny import save_tiny
    from tandem.roles.layout import device_choice
    from tandem.trainer.ppo import RLTrainer

    here_cuda = torch.cuda.is_available()
    report["driver"] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda_available": here_cuda,
        "device_name": torch.cuda.get_device_name(0) if here_cuda else None,
        "ray": ray.__version__,
    }
    say(f"driver: {report['driver']}")

    folder = save_tiny(workdir / "model")
    rows = make_rows("addition", 256, seed=0, digits=2)
    for row in rows:  # raw text: what the model sees is exactly "a+b="
        row["prompt"] = row["prompt"][0]["content"]
    data = write_rows(rows, workdir / "train.parquet")
    report["overrides"] = overrides(args, folder, data, workdir / "runs")
    cfg = load_config("grpo", report["overrides"], require_data=True)

    start = time.perf_counter()
    init_ray(object_store_memory=args.object_store_gib << 30)  # Tandem's start; a small object store
    report["ray_start_s"] = time.perf_counter() - start
    resources = ray.cluster_resources()
    report["cluster_resources"] = {k: v for k, v in resources.items() if not k.startswith("node:")}
    gpus = int(resources.get("GPU", 0))
    say(f"Ray {ray.__version__} started in {report['ray_start_s']:.1f} s: {report['cluster_resources']}")
    say(f"Ray cluster GPU count: {gpus}")
    if here_cuda and gpus == 0:
        raise RuntimeError("torch sees a GPU here but Ray's cluster has none: Ray did not detect the GPU")

    task = ray.remote(probe).options(num_gpus=1) if gpus else ray.remote(probe).options(num_cpus=1)
    report["probe"] = ray.get(task.remote(), timeout=120)
    say(f"probe task (num_gpus={1 if gpus else 0}) in a Ray worker: {report['probe']}")
    if here_cuda and not report["probe"]["cuda_available"]:
        raise RuntimeError(
            "a Ray task given the GPU cannot use it (torch.cuda.is_available() is False there)"
        )
    device, why = device_choice(cfg)
    report["device"], report["device_why"] = device, why
    say(f"trainer.device={cfg.trainer.device} -> {device} ({why})")
    if here_cuda and device != "cuda":
        raise RuntimeError(f"trainer.device=auto chose {device} on a machine with a GPU")

    trainer = RLTrainer(cfg)
    report["run_dir"] = str(trainer.run_dir)
    start = time.perf_counter()
    history = trainer.fit()
    report["fit_s"] = time.perf_counter() - start
    steps = [m for m in history if "timing_s/step" in m]
    report["steps"] = steps
    say(f"{len(steps)} steps in {report['fit_s']:.1f} s (the workers' start included)")
    for m in steps:
        shown = {k.split("/", 1)[1] if k.startswith("timing_s/") else k: m[k] for k in SHOWN if k in m}
        say(f"step {int(m['step'])}: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items()))
        mismatch = {k: v for k, v in m.items() if k.startswith("rollout_mismatch/")}
        say(
            f"step {int(m['step'])} rollout_mismatch: "
            + (", ".join(f"{k.split('/')[1]} {v:.4g}" for k, v in mismatch.items()) or "none reported")
        )
    if len(steps) != args.steps:
        raise RuntimeError(f"{args.steps} steps asked, {len(steps)} logged")
    on_cuda = all(m.get("memory/peak_allocated_gib", 0) > 0 for m in steps)
    report["workers_on_cuda"] = on_cuda
    say(f"workers on cuda (each step's worker peak GPU memory > 0): {on_cuda}")
    if device == "cuda" and not on_cuda:
        raise RuntimeError(
            "the device is cuda but the workers reported no GPU memory: they did not run on it"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="responses per prompt (rollout.n)")
    parser.add_argument("--tokens", type=int, default=32, help="data.max_response_length")
    parser.add_argument("--device", default="auto", help="trainer.device")
    parser.add_argument("--cpus-per-worker", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--object-store-gib", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or tempfile.gettempdir()))
    parser.add_argument(
        "--workdir", type=Path, help="for the model, data and run folder (default: a new one)"
    )
    parser.add_argument("overrides", nargs="*", help="key=value, after the script's own")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"ok": False}
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tandem-gpu-ray-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        run(args, report, workdir)
        report["ok"] = True
    except BaseException as error:
        report["error"] = traceback.format_exc()
        traceback.print_exc()
        say(f"FAILED: {type(error).__name__}: {error}")
        run_dir = Path(report.get("run_dir", workdir / "runs" / "gpu_ray" / "grpo"))
        show_logs(run_dir / "logs", ray_log_dir())
    finally:
        (args.out / "gpu_ray.json").write_text(json.dumps(report, indent=1, default=str))
        say(f"report in {args.out / 'gpu_ray.json'}")
        try:
            import ray

            ray.shutdown()
        except Exception:
            pass
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()

"""Trains a tiny model with verl 0.9.1's `verl.trainer.sft_trainer` on CPU (fp32, 4 steps) for each case of
tests/verl/test_sft_parity.py, and writes what verl made: tests/verl/data/sft_parity/verl.json (the cases: their
command lines, rows and tiny model; verl's loss, grad norm and learning rate per step) and weights.safetensors (the
trained weights of every case, `<case>/<parameter>`). The test runs `tandem sft` on the same lines and compares.

It needs a Python where verl 0.9.1 and Tandem both import, e.g. a virtual environment that reads Tandem's venv
through .pth files (the venv's site-packages and src/) and verl's wheel unpacked (`pip download verl==0.9.1
--no-deps`), with the packages verl's SFT trainer imports that Tandem's venv lacks added by `pip install --no-deps`
(torchdata codetiming orjson tyro spmd_types datasets multiprocess pandas pytz):

    /tmp/verlenv/bin/python scripts/sft_parity_verl.py

verl's trainer is run as its `SFTTrainer(config).fit()` with the config Hydra composes from its own
`sft_trainer_engine.yaml` and the case's command line, with what CPU needs and nothing else changed:
- a CPU device platform (verl 0.9.1 registers CUDA, ROCm and NPU only), with `VERL_ENGINE_DEVICE=cuda` so that
  verl's own FSDP engine class is picked (it is registered for those devices only); a 1-rank gloo process group
  started here (verl's own start asks for `cpu:gloo,<device>:<backend>`, which names the CPU twice on a CPU);
- `engine.strategy=fsdp` becomes `fsdp2` (FSDP1 checks the module's states on a GPU at start-up);
- `model.use_remove_padding=True` becomes `False` with `+model.override_config.attn_implementation=sdpa`: verl's
  packed rows need flash-attention's variable-length kernel (CUDA only); its padded path computes the same
  log-probs with a padding mask.
Tandem's side gets the line as written (packed rows, FSDP2 on every `engine.strategy`).

Every case trains on all its rows each step (`data.train_batch_size` = the rows), so the order in which verl's
sampler draws them cannot change the update.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests/verl/data/sft_parity"

# the tiny model: save_tiny(**MODEL) (seeded, so the test rebuilds the same start)
MODEL = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "seed": 0,
}

TOOL_CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"2*3"}}</tool_call>'
ROWS = {
    # one question, one answer; answers of 2 to 16 characters (one token each) so rows differ in length
    "single_turn": [
        [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": "ab" + "xyz"[i % 3] * (2 * i)},
        ]
        for i in range(8)
    ],
    # two assistant turns per conversation, a system prompt and a tool's turn
    "multi_turn": [
        [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"a{i}"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": f"b{i}{i}"},
        ]
        for i in range(4)
    ]
    + [
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "2*3"},
            {"role": "assistant", "content": TOOL_CALL},
            {"role": "tool", "content": "6"},
            {"role": "assistant", "content": "6"},
        ],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
    ],
}

# run_sft_engine.sh's line (one GPU), 4 steps in fp32 on CPU; the paths are added by the runner
BASE = [
    "data.pad_mode=no_padding",
    "data.truncation=error",
    "data.use_dynamic_bsz=True",
    "data.max_token_len_per_gpu=2048",
    "data.messages_key=messages",
    "data.max_length=128",
    "data.num_workers=0",
    "model.use_remove_padding=True",
    "engine=fsdp",
    "optim=fsdp",
    "engine.ulysses_sequence_parallel_size=1",
    "engine.strategy=fsdp",
    "+engine.mixed_precision={param_dtype:fp32}",
    "trainer.total_epochs=4",
    "trainer.total_training_steps=4",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.logger=['console','file']",
    "trainer.project_name=sft_parity",
    "trainer.resume_mode=disable",
    "trainer.device=cpu",
]
# the optimizer keys verl's SFT example scripts pass, at a rate that moves the tiny model visibly in 4 steps
# (they use 1e-5 to 2e-5); a warm-up ratio of 0.2 is no warm-up step at 4 steps
OPTIM = [
    "optim.lr=1e-3",
    "optim.lr_warmup_steps_ratio=0.2",
    "optim.weight_decay=0.1",
    "optim.betas=[0.9,0.95]",
    "optim.clip_grad=1.0",
    "optim.min_lr_ratio=0.1",
]


def _with(line: list[str], *changes: str) -> list[str]:
    """`line` with each `key=value` of `changes` replacing the same key's item (appended when absent)."""
    out = list(line)
    for change in changes:
        key = change.partition("=")[0]
        at = [i for i, item in enumerate(out) if item.partition("=")[0] == key]
        if at:
            out[at[0]] = change
        else:
            out.append(change)
    return out


# name -> (rows, command line)
CASES = {
    # no optim.* keys: optim/fsdp.yaml's lr 1e-3, betas (0.9, 0.999), weight decay 0.01, constant, clip 1.0
    "defaults": ("single_turn", BASE),
    # the optimizer keys of verl's example scripts, FSDP2 as some of them ask
    "single_turn": (
        "single_turn",
        _with(BASE, *OPTIM, "optim.lr_scheduler_type=cosine", "engine.strategy=fsdp2"),
    ),
    # one row a micro-batch: the loss is each micro-batch's token sum over the whole batch's trained tokens;
    # the schedule by its deprecated name, as verl's example scripts still write it
    "micro_batch_1": (
        "single_turn",
        _with(
            BASE,
            *OPTIM,
            "optim.warmup_style=cosine",
            "data.use_dynamic_bsz=False",
            "data.micro_batch_size_per_gpu=1",
        ),
    ),
    # rows packed into micro-batches of at most 48 tokens (several per step)
    "token_budget": (
        "single_turn",
        _with(
            BASE,
            *OPTIM,
            "optim.lr_scheduler_type=cosine",
            "data.max_token_len_per_gpu=48",
            "data.max_length=40",
        ),
    ),
    # the Qwen-style template (<|im_end|>\n ends a turn): every assistant turn trained whole
    "multi_turn": (
        "multi_turn",
        _with(BASE, *OPTIM, "optim.lr_scheduler_type=cosine", "data.max_length=192"),
    ),
    # rows longer than data.max_length cut at the right (63 of the 88 trained tokens stay)
    "truncation_right": (
        "single_turn",
        _with(BASE, *OPTIM, "optim.lr_scheduler_type=cosine", "data.truncation=right", "data.max_length=30"),
    ),
}

# what verl's run on CPU changes of a line (see the module docstring)
VERL_ON_CPU = {
    "engine.strategy=fsdp": "engine.strategy=fsdp2",
    "model.use_remove_padding=True": "model.use_remove_padding=False",
}
VERL_ON_CPU_EXTRA = ["+model.override_config.attn_implementation=sdpa"]


def paths(line: list[str], rows: Path, n_rows: int, model: Path, run: Path) -> list[str]:
    """The case's line with its rows, model and run folder, and all its `n_rows` rows in one batch."""
    return [
        *line,
        f"data.train_files={rows}",
        f"data.train_batch_size={n_rows}",
        f"model.path={model}",
        f"trainer.default_local_dir={run}",
    ]


def write_rows(name: str, folder: Path) -> Path:
    """The rows as verl reads them: a parquet of `messages`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / f"{name}.parquet"
    pq.write_table(pa.table({"messages": ROWS[name]}), path)
    return path


def _cpu_platform():
    """verl's device platform for the CPU (verl 0.9.1 has none)."""
    import torch
    from verl.plugin.platform import PlatformBase

    class Device(types.ModuleType):
        """torch.cpu, with the CUDA memory and naming calls verl makes answered for a CPU."""

        def __getattr__(self, name):
            answers = {
                "get_rng_state": torch.get_rng_state,
                "set_rng_state": torch.set_rng_state,
                "mem_get_info": lambda *a, **k: (0, 0),
                "get_device_name": lambda *a, **k: "cpu",
            }
            if name in answers:
                return answers[name]
            return getattr(torch.cpu, name, lambda *a, **k: 0)

    class PlatformCPU(PlatformBase):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: Device("cpu_device"))

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings):
            pass

        def empty_cache(self):
            pass

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg):
            yield

        def profiler_start(self):
            pass

        def profiler_stop(self):
            pass

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    return PlatformCPU()


def run_case(line: list[str], out: Path) -> None:
    """One verl run (in its own process: verl keeps a process group and a platform per process): verl's metrics
    to out/metrics.jsonl, the trained weights to out/weights.safetensors."""
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", VERL_ENGINE_DEVICE="cuda"
    )
    os.environ.setdefault("MASTER_PORT", "29531")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(out / "metrics.jsonl")
    from verl.plugin.platform import set_platform

    set_platform(_cpu_platform())
    import torch
    import verl.trainer.sft_trainer as sft_trainer
    from hydra import compose, initialize_config_dir
    from safetensors.torch import save_file

    with initialize_config_dir(
        config_dir=str(Path(sft_trainer.__file__).parent / "config"), version_base=None
    ):
        config = compose(config_name="sft_trainer_engine", overrides=line)
    torch.distributed.init_process_group("gloo")
    trainer = sft_trainer.SFTTrainer(config=config)
    trainer.fit()
    weights = {}
    for name, value in trainer.engine.module.state_dict().items():
        if name == "lm_head.weight":  # tied to the embedding
            continue
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        weights[name] = value.detach().float().cpu().contiguous()
    save_file(weights, out / "weights.safetensors")
    torch.distributed.destroy_process_group()


def verl_line(line: list[str]) -> list[str]:
    """The line as verl runs it on a CPU (VERL_ON_CPU: see the module docstring)."""
    return [VERL_ON_CPU.get(item, item) for item in line] + VERL_ON_CPU_EXTRA


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case-line", help=argparse.SUPPRESS)
    parser.add_argument("--case-out", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", help="the cases to run (default: all)")
    args = parser.parse_args()
    if args.case_line:
        run_case(json.loads(args.case_line), Path(args.case_out))
        return

    import safetensors.torch

    import verl
    from tandem.models.tiny import save_tiny

    results = json.loads((OUT / "verl.json").read_text()) if args.only else {"cases": {}}
    weights = safetensors.torch.load_file(OUT / "weights.safetensors") if args.only else {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = save_tiny(tmp / "model", **MODEL)
        start = safetensors.torch.load_file(model / "model.safetensors")
        rows = {name: write_rows(name, tmp) for name in ROWS}
        for name, (rows_name, line) in CASES.items():
            if args.only and name not in args.only:
                continue
            run = tmp / name
            run.mkdir()
            full = verl_line(paths(line, rows[rows_name], len(ROWS[rows_name]), model, run / "ckpt"))
            print(f"== {name}: {' '.join(full)}", flush=True)
            with open(run / "verl.log", "w") as log:
                done = subprocess.run(
                    [sys.executable, __file__, "--case-line", json.dumps(full), "--case-out", str(run)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if done.returncode:
                sys.exit(f"verl's run of {name} failed:\n{(run / 'verl.log').read_text()[-4000:]}")
            steps = [json.loads(text)["data"] for text in (run / "metrics.jsonl").read_text().splitlines()]
            results["cases"][name] = {
                "rows": rows_name,
                "line": line,
                "loss": [s["train/loss"] for s in steps],
                "grad_norm": [s["train/grad_norm"] for s in steps],
                "lr": [s["train/lr"] for s in steps],
            }
            trained = safetensors.torch.load_file(run / "weights.safetensors")
            weights.update({f"{name}/{key}": value for key, value in trained.items()})
            print(f"   loss {results['cases'][name]['loss']}", flush=True)
    results.update(
        verl_version=verl.__version__,
        model=MODEL,
        rows=ROWS,
        # the start weights' sums, so a test whose rebuilt tiny model differs says so first
        start_sums={key: float(value.double().sum()) for key, value in sorted(start.items())},
        verl_on_cpu=sorted(VERL_ON_CPU.values()) + VERL_ON_CPU_EXTRA,
    )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "verl.json").write_text(json.dumps(results, indent=1) + "\n")
    safetensors.torch.save_file(dict(sorted(weights.items())), OUT / "weights.safetensors")
    print(f"wrote {OUT / 'verl.json'} and {OUT / 'weights.safetensors'}")


if __name__ == "__main__":
    main()

"""`tandem`: the command line.

    tandem quickstart [--out DIR] [--task addition|calculator|vision] [key=value ...]   the main job: tiny model, SFT, GRPO
    tandem train PRESET|FILE [key=value ...]        RL training (grpo, ppo, dapo, rloo, remax, ...)
    tandem sft [PRESET|FILE] [key=value ...]        supervised fine-tuning (default preset: sft)
    tandem eval PRESET|FILE [key=value ...] [--checkpoint DIR]   validation accuracy of a model
    tandem export CHECKPOINT [OUT_DIR] [--role actor|critic]      a Hugging Face folder from a checkpoint
    tandem convert hf-to-mcore MODEL_DIR OUT_DIR    a megatron distributed checkpoint of a Hugging Face folder
    tandem convert mcore-to-hf CHECKPOINT MODEL_DIR OUT_DIR   ... and back (MODEL_DIR: config, tokenizer)
    tandem generate [FILE] key=value ... [--overwrite]   n samples per prompt of a parquet file (verl's
                                                    main_generation keys too; resumes an interrupted run)
                    [--check]                         the checks and the resolved config alone, as YAML
    tandem config [PRESET|FILE] [key=value ...]     print the resolved, validated config as YAML
                  [--gpus-per-node N]                 (workers_per_node=auto resolved for N GPUs per node)
    tandem config --from-verl FILE                  a verl YAML (with its defaults) as a Tandem YAML
    tandem config generate [FILE] key=value ...     tandem generate --check

verl's keys and Hydra flags are read as Tandem's: `tandem train actor_rollout_ref.model.path=DIR ...`
or `tandem train --config-path DIR --config-name NAME ...` (the base is then the `verl` preset, verl's
defaults); the run prints the translation once (tandem/config/verl/translate.py).
    tandem presets                                  list the bundled presets
    tandem data TASK OUT_DIR [--n-train N] [--n-val N] [--seed S]   write a synthetic task
    tandem view RUN_DIR [RUN_DIR ...] [--port N] [--static OUT.html]   a local page of runs: curves, samples

Exit status: 0 done; 2 bad config, data, model folder or checkpoint, or a run folder another run
holds: a message naming the key, row, file or holder, before any worker starts; 1 a failure while
running: one headline (the root exception, its message, where it was raised) and the path of
`<run folder>/logs/error.log`, which holds the full tracebacks (every worker's output is in
`<run folder>/logs/` too); 130 interrupted (Ctrl-C); 143 SIGTERM (tandem/controller/cleanup.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description="RL post-training for language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    quick = sub.add_parser("quickstart", help="the main job on a tiny model (CPU, a few minutes)")
    quick.add_argument("overrides", nargs="*", help="RL config overrides such as actor.optim.lr=1e-5")
    quick.add_argument("--out", default="runs/quickstart", help="output folder (default: runs/quickstart)")
    quick.add_argument("--seed", type=int, default=0, help="seeds model init, data and training (default: 0)")
    quick.add_argument(
        "--task",
        default="addition",
        choices=["addition", "calculator", "vision"],
        help="addition (default); calculator: multi-turn tool use on the agent loop; vision: a tiny "
        "vision-language model counts squares in images",
    )

    train = sub.add_parser("train", help="RL training from a preset or YAML file")
    train.add_argument(
        "preset", nargs="?", default="grpo", help="preset name (tandem presets) or YAML path (default: grpo)"
    )
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.train_files=[a.parquet]")

    sft = sub.add_parser("sft", help="supervised fine-tuning; exports <run dir>/hf_model")
    sft.add_argument("preset", nargs="?", default="sft", help="preset name or YAML path (default: sft)")
    sft.add_argument("overrides", nargs="*")

    ev = sub.add_parser("eval", help="validation metrics of actor.model_path (or a checkpoint)")
    ev.add_argument("preset", nargs="?", default="grpo", help="preset name or YAML path (default: grpo)")
    ev.add_argument("overrides", nargs="*")
    ev.add_argument("--checkpoint", help="a global_step_N checkpoint folder, or auto (this run's newest)")

    export = sub.add_parser("export", help="write a Hugging Face folder from a checkpoint")
    export.add_argument("checkpoint", help="a checkpoints/global_step_N folder")
    export.add_argument(
        "out_dir", nargs="?", help="default: the checkpoint's own <role>/huggingface folder (verl's place)"
    )
    export.add_argument("--role", default="actor", choices=["actor", "critic"])

    gen = sub.add_parser(
        "generate",
        help="n samples per prompt of a parquet file, written as verl's main_generation writes them",
        description="Keys (key=value): model_path, data_path, output_path, prompt_key, n, batch_size, "
        "max_prompt_length, max_response_length, truncation, temperature, top_p, top_k, seed, engine "
        "(auto/vllm/hf), device, dtype, engine_kwargs.*, extra_columns, overwrite; several engines: nnodes, "
        "workers_per_node, tensor_parallel, replicas, cpus_per_worker, ray_address; or verl's main_generation "
        "keys (data.path, data.n_samples, model.path, rollout.temperature, ...). An interrupted run started "
        "again with the same keys resumes.",
    )
    gen.add_argument(
        "overrides", nargs="*", help="a YAML file of these keys first (optional), then key=value"
    )
    gen.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    gen.add_argument(
        "--check",
        action="store_true",
        help="run the start-up checks (tokenizer, prompts, output file) and print the resolved config as "
        "YAML; no model is loaded, nothing is written",
    )

    config = sub.add_parser("config", help="print the resolved config")
    config.add_argument("preset", nargs="?", default="grpo", help="preset name or YAML path (default: grpo)")
    config.add_argument("overrides", nargs="*")
    config.add_argument(
        "--from-verl", metavar="FILE", help="write a verl YAML (with its defaults) as a Tandem YAML"
    )
    config.add_argument(
        "--gpus-per-node",
        type=int,
        metavar="N",
        help="resolve workers_per_node=auto for nodes of N GPUs (default: count this machine's, or the "
        "cluster's with trainer.ray_address)",
    )
    for command in (train, sft, ev, config):  # verl's Hydra flags: a verl YAML as the config
        command.add_argument("--config-path", "-cp", help="verl/Hydra: the folder of --config-name")
        command.add_argument("--config-name", "-cn", help="verl/Hydra: a verl YAML, without .yaml")

    convert = sub.add_parser(
        "convert",
        help="a Hugging Face folder <-> a megatron distributed checkpoint (actor.megatron.dist_checkpoint)",
    )
    convert.add_argument("direction", choices=["hf-to-mcore", "mcore-to-hf"])
    convert.add_argument(
        "paths", nargs="+", help="hf-to-mcore: MODEL_DIR OUT_DIR; mcore-to-hf: CHECKPOINT MODEL_DIR OUT_DIR"
    )
    convert.add_argument(
        "--head", default="lm", choices=["lm", "value"], help="value: a critic's (token classifier)"
    )

    sub.add_parser("presets", help="list the bundled presets")

    data = sub.add_parser("data", help="write a built-in synthetic task as train/val parquet")
    data.add_argument("task", help="addition, countdown or tool_multiply (with tool-use conversations)")
    data.add_argument("out_dir")
    data.add_argument("--n-train", type=int, default=1024)
    data.add_argument("--n-val", type=int, default=128)
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--format", default="parquet", choices=["parquet", "jsonl"])

    view = sub.add_parser("view", help="a page of runs on 127.0.0.1: metric curves, the samples of any step")
    view.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders (several: overlaid)")
    view.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default: 8765; 0: any free)")
    view.add_argument(
        "--static", metavar="OUT.html", help="write one self-contained HTML file instead of serving"
    )
    return parser


def _view(args: argparse.Namespace) -> int:
    from tandem.view import RunFolderError, open_runs, serve, write_static

    try:
        runs = open_runs(args.run_dirs)
        if args.static:
            print(f"tandem view: wrote {write_static(runs, args.static)} (opens from disk in a browser)")
        else:
            serve(runs, args.port)
    except (RunFolderError, OSError) as err:
        print(f"tandem view: {err}", file=sys.stderr)
        return 2
    return 0


def _preset_and_overrides(args: argparse.Namespace, default: str) -> tuple[str, list[str]]:
    preset, overrides = args.preset, list(args.overrides)
    if "=" in preset:  # `tandem config a.b=1`: an override, not a preset name
        preset, overrides = default, [preset, *overrides]
        if any(is_verl_sft_override(o) for o in overrides):  # verl's SFT command line: its trainer's defaults
            from tandem.config.verl import verl_sft_preset

            preset = verl_sft_preset(o.partition("=")[0].strip() for o in overrides)
        elif any(is_verl_override(o) for o in overrides):  # a verl command line: verl's defaults under it
            preset = "verl"
    if getattr(args, "config_name", None):  # verl's --config-path DIR --config-name NAME
        if "=" not in args.preset and args.preset != default:
            from tandem.config import ConfigError

            raise ConfigError(
                f"give the config once: the preset or YAML '{args.preset}', or --config-name "
                f"{args.config_name}, not both"
            )
        name = (
            args.config_name if args.config_name.endswith((".yaml", ".yml")) else f"{args.config_name}.yaml"
        )
        preset = str(Path(args.config_path or ".").expanduser() / name)
    return preset, overrides


def is_verl_override(text: str) -> bool:
    """Whether `key=value` uses a key only verl has (config/verl/keys.py): one Tandem's schema has as well
    (trainer.device) says nothing of whose command line it is, and must not put verl's defaults under a Tandem one."""
    from tandem.config.verl import is_tandem_key, is_verl_key

    key = text.partition("=")[0].strip().lstrip("+")
    return is_verl_key(key) and not is_tandem_key(key)


def is_verl_sft_override(text: str) -> bool:
    """Whether `key=value` uses a key only verl's SFT trainers have (config/verl/sft_keys.py)."""
    from tandem.config.verl import is_verl_sft_key

    return is_verl_sft_key(text.partition("=")[0].strip().lstrip("+"))


def _is_sft(args: argparse.Namespace, preset: str) -> bool:
    """An SFT config: `tandem sft`, the sft presets, or verl's SFT YAML (--config-name sft_trainer...)."""
    return (
        args.command == "sft"
        or preset in ("sft", "verl_sft", "verl_sft_engine")
        or Path(preset).stem.startswith("sft_trainer")
    )


_HYDRA_FLAGS = ("--config-path", "-cp", "--config-name", "-cn")


def hydra_flags_first(argv: list[str]) -> list[str]:
    """Hydra's flags (and their values) moved to just after the command, as Hydra takes them anywhere:
    `tandem train a=1 --config-path=D --config-name=N b=2`."""
    if not argv:
        return argv
    head, flags, rest = argv[:1], [], []
    i = 1
    while i < len(argv):
        text = argv[i]
        if text.split("=", 1)[0] in _HYDRA_FLAGS:
            flags.append(text)
            if "=" not in text and i + 1 < len(argv):
                flags.append(argv[i + 1])
                i += 1
        else:
            rest.append(text)
        i += 1
    return [*head, *flags, *rest]


def _print_translation(command: str):
    def show(translation) -> None:
        print(translation.summary(command), file=sys.stderr)

    return show


def _convert(args: argparse.Namespace) -> int:
    """`tandem convert`: one process, one CPU rank (engine/megatron/dist_convert.py)."""
    wanted = 2 if args.direction == "hf-to-mcore" else 3
    if len(args.paths) != wanted:
        names = "MODEL_DIR OUT_DIR" if wanted == 2 else "CHECKPOINT MODEL_DIR OUT_DIR"
        print(f"tandem convert {args.direction}: give {names}", file=sys.stderr)
        return 2
    from tandem.engine.megatron import dist_convert

    if args.direction == "hf-to-mcore":
        print(dist_convert.hf_to_mcore(*args.paths, head=args.head))
    else:
        print(dist_convert.mcore_to_hf(*args.paths, head=args.head))
    return 0


def _run(args: argparse.Namespace) -> int:
    from tandem.config import config_to_yaml, list_presets, load_config

    if args.command == "quickstart":
        from tandem.commands.quickstart import run

        args.log_dir = Path(args.out) / "logs"
        run(args.out, args.overrides, seed=args.seed, task=args.task)
    elif args.command in ("train", "sft", "eval"):
        from tandem.engine import hf_io
        from tandem.trainer import RLTrainer, SFTTrainer
        from tandem.trainer.base import run_dir

        preset, overrides = _preset_and_overrides(args, "sft" if args.command == "sft" else "grpo")
        cfg = load_config(
            preset,
            overrides,
            require_data=args.command != "eval",
            on_verl=_print_translation(f"tandem {args.command} {preset}"),
            sft=_is_sft(args, preset),
        )
        args.log_dir = run_dir(cfg) / "logs"
        if args.command == "eval" and cfg.actor.model_path and hf_io.is_adapter_folder(cfg.actor.model_path):
            # a LoRA export's adapter folder: evaluated as its base with the adapters merged in
            cfg.actor.model_path = str(
                hf_io.merge_adapter(cfg.actor.model_path, run_dir(cfg) / "merged_adapter")
            )
        if args.command == "train":
            RLTrainer(cfg).fit()
        elif args.command == "sft":
            SFTTrainer(cfg).fit()
        else:
            metrics = RLTrainer(cfg, train=False).evaluate(args.checkpoint)
            print(json.dumps(metrics, indent=1, sort_keys=True))
    elif args.command == "export":
        from tandem.commands.export import export_checkpoint

        args.log_dir = Path(args.checkpoint).absolute().parent.parent / "logs"  # the checkpoint's run folder
        print(export_checkpoint(args.checkpoint, args.out_dir, args.role))
    elif args.command == "generate":
        _generate(args)
    elif args.command == "config" and args.from_verl:
        from tandem.config.loader import verl_yaml_to_tandem

        print(verl_yaml_to_tandem(args.from_verl), end="")
    elif args.command == "config" and args.preset == "generate":  # an alias of `tandem generate --check`
        if args.gpus_per_node is not None or args.config_name:
            from tandem.config import ConfigError

            raise ConfigError(
                "tandem config generate takes tandem generate's keys; no --gpus-per-node or -cn"
            )
        args.overwrite, args.check = False, True
        _generate(args)
    elif args.command == "config":
        preset, overrides = _preset_and_overrides(args, "grpo")
        cfg = load_config(
            preset,
            overrides,
            on_verl=_print_translation(f"tandem config {preset}"),
            gpus_per_node=args.gpus_per_node,
            sft=_is_sft(args, preset),
        )
        if not _is_sft(args, preset):  # RL and eval: every row's data_source needs a reward scorer
            from tandem.config.checks.data_sources import check_data_sources

            for unchecked in check_data_sources(cfg):
                print(f"tandem config: data_source not checked, {unchecked}", file=sys.stderr)
        print(config_to_yaml(cfg), end="")
    elif args.command == "presets":
        print("\n".join(list_presets()))
    elif args.command == "convert":
        return _convert(args)
    elif args.command == "data":
        from tandem.data import TASKS, write_splits

        if args.task not in TASKS:
            print(
                f"tandem data: unknown task '{args.task}'; known: {', '.join(sorted(TASKS))}", file=sys.stderr
            )
            return 2
        try:
            paths = write_splits(
                args.task,
                args.out_dir,
                n_train=args.n_train,
                n_val=args.n_val,
                seed=args.seed,
                fmt=args.format,
            )
        except ValueError as err:  # sizes the task cannot meet
            print(f"tandem data: {err}", file=sys.stderr)
            return 2
        print("\n".join(str(p) for p in paths.values()))
    return 0


def _generate(args: argparse.Namespace) -> None:
    from tandem.commands.generate import plan_generation, run_generation
    from tandem.config.generate import generate_config_to_yaml, load_generate_config

    overrides = list(args.overrides)
    file = overrides.pop(0) if overrides and "=" not in overrides[0] else None
    if args.overwrite:
        overrides.append("overwrite=true")
    cfg, key_names = load_generate_config(file, overrides, on_verl=_print_translation("tandem generate"))
    if args.check:  # the start-up checks alone: no engine, nothing written
        print(plan_generation(cfg, key_names=key_names).summary(cfg), file=sys.stderr)
        print(generate_config_to_yaml(cfg), end="")
        return
    print(run_generation(cfg, key_names=key_names))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(hydra_flags_first(sys.argv[1:] if argv is None else list(argv)))
    args.log_dir = None  # set by _run once the run folder is known
    if args.command == "view":  # reads files only: none of the training stack is imported
        return _view(args)
    from tandem.config import ConfigError

    try:
        return _run(args)
    except ConfigError as err:
        print(f"tandem {args.command}: config error\n{err}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"tandem {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if isinstance(err, _input_errors()):  # bad data, data source, file or a held run folder: exit 2
            message = err.args[0] if isinstance(err, KeyError) and err.args else err
            print(f"tandem {args.command}: {message}", file=sys.stderr)
            return 2
        # a worker failed, or a bug: one headline here, the tracebacks in a file
        log = write_error_log(err, args.log_dir)
        print(f"tandem {args.command}: {headline(err)}\n  full tracebacks: {log}", file=sys.stderr)
        return 1
    return 2


# The errors of bad input besides ConfigError, by the module that defines each. Their packages import
# torch, so they are looked up only where a command has imported them: a command that never loaded the
# data package cannot have raised its DataError, and `tandem config` stays free of torch.
_INPUT_ERRORS = (
    ("tandem.data.rows", "DataError"),
    ("tandem.rewards.registry", "UnknownDataSourceError"),
    ("tandem.trainer.run_lock", "RunLockedError"),
)


def _input_errors() -> tuple[type[BaseException], ...]:
    """FileNotFoundError and those of _INPUT_ERRORS whose module this process has imported."""
    loaded = [getattr(sys.modules[module], name) for module, name in _INPUT_ERRORS if module in sys.modules]
    return (FileNotFoundError, *loaded)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def headline(err: BaseException) -> str:
    """One line: the failing worker (if any), the exception type and message, and where it was raised."""
    errors = sys.modules.get("tandem.controller.errors")  # a WorkerError comes only where it is loaded
    if errors is not None and isinstance(err, errors.WorkerError):
        frames = _FRAME.findall(err.worker_traceback)
        first_line = err.error_message.strip().splitlines()[0] if err.error_message.strip() else ""
        text = err.summary.replace(err.error_message, first_line) if first_line else err.summary
    else:
        while err.__cause__ is not None:  # the root of a `raise ... from ...` chain
            err = err.__cause__
        frames = [(f.filename, str(f.lineno)) for f in traceback.extract_tb(err.__traceback__)]
        message = str(err).strip().splitlines()
        text = f"{type(err).__name__}: {message[0]}" if message else type(err).__name__
    return f"{text} (at {frames[-1][0]}:{frames[-1][1]})" if frames else text


def write_error_log(err: BaseException, log_dir: Path | None) -> Path:
    """The full traceback of `err` (with every worker's, for a WorkerError) appended to log_dir/error.log."""
    if log_dir is None:
        log_dir = Path(tempfile.gettempdir()) / "tandem-logs"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / "error.log"
        with path.open("a") as f:
            f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
            f.write("".join(traceback.format_exception(err)))
    except OSError:  # the run folder is not writable: the terminal is the last resort
        traceback.print_exception(err)
        return Path("(not written: see the traceback above)")
    return path


if __name__ == "__main__":
    raise SystemExit(main())

"""`tandem`: the command line.

    tandem quickstart [key=value ...]        the main job (for now: SFT + GRPO steps on the runtime)
    tandem config [PRESET|FILE] [key=value]  print the resolved, validated config as YAML
    tandem presets                           list the bundled presets
    tandem data TASK OUT_DIR [--n-train N] [--n-val N] [--seed S]   write a synthetic task

The trainer commands (`train`, `sft`, `eval`, `export`) arrive with the trainer.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description="RL post-training for language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    quick = sub.add_parser("quickstart", help="run the main job on a tiny model (CPU, a few minutes)")
    quick.add_argument("overrides", nargs="*", help="config overrides such as actor.optim.lr=1e-6")
    quick.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    quick.add_argument("--sft-steps", type=int, default=400)
    quick.add_argument("--rl-steps", type=int, default=8)

    config = sub.add_parser("config", help="print the resolved config")
    config.add_argument("preset", nargs="?", default="grpo", help="preset name or YAML path (default: grpo)")
    config.add_argument("overrides", nargs="*")

    sub.add_parser("presets", help="list the bundled presets")

    data = sub.add_parser("data", help="write a built-in synthetic task as train/val parquet")
    data.add_argument("task", help="addition or countdown")
    data.add_argument("out_dir")
    data.add_argument("--n-train", type=int, default=1024)
    data.add_argument("--n-val", type=int, default=128)
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--format", default="parquet", choices=["parquet", "jsonl"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    from tandem.config import ConfigError

    try:
        if args.command == "quickstart":
            from tandem.demo import run

            run(args.out, args.overrides, sft_steps=args.sft_steps, rl_steps=args.rl_steps)
        elif args.command == "config":
            from tandem.config import load_config

            preset, overrides = args.preset, list(args.overrides)
            if "=" in preset:  # `tandem config a.b=1`: an override, not a preset name
                preset, overrides = "grpo", [preset, *overrides]
            print(load_config(preset, overrides).to_yaml(), end="")
        elif args.command == "presets":
            from tandem.config import list_presets

            print("\n".join(list_presets()))
        elif args.command == "data":
            from tandem.data import TASKS, write_splits

            if args.task not in TASKS:
                print(
                    f"tandem data: unknown task '{args.task}'; known: {', '.join(sorted(TASKS))}",
                    file=sys.stderr,
                )
                return 2
            paths = write_splits(
                args.task,
                args.out_dir,
                n_train=args.n_train,
                n_val=args.n_val,
                seed=args.seed,
                fmt=args.format,
            )
            print("\n".join(str(p) for p in paths.values()))
    except ConfigError as err:
        print(f"tandem {args.command}: config error\n{err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Reading a run folder for `tandem view` (its layout: `tandem/run_folder.py`): its metrics.jsonl and its sample dumps, read afresh on every
call so that a run still writing the folder shows its new steps; a half-written last line is skipped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from tandem.run_folder import CONFIG_FILE, DUMP_KINDS, METRICS_FILE, SFT_METRIC, STEP, dump_file, dump_steps


class RunFolderError(ValueError):
    """A folder given to `tandem view` that is not a run folder."""


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a jsonl file, one per line; a line that does not parse (the last line of a file
    being written, a line cut by a crash) is skipped, so a file in use reads as the lines written so far."""
    rows = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return rows
    for line in text.split("\n"):  # not splitlines(): a JSON string may hold U+2028 or U+0085 unescaped
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


@dataclass
class Run:
    """One run folder: `path` holds config.yaml and/or metrics.jsonl; `name` labels it on the page."""

    path: Path
    name: str

    def config(self) -> dict:
        try:
            loaded = yaml.safe_load((self.path / CONFIG_FILE).read_text())
        except (FileNotFoundError, yaml.YAMLError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def dump_dir(self, kind: str) -> Path | None:
        """The folder of the `kind` dumps ("rollouts" or "validation"): the config's
        trainer.rollout_data_dir / trainer.validation_data_dir, else `<run>/<kind>` where it exists."""
        named = (self.config().get("trainer") or {}).get(DUMP_KINDS[kind])
        candidates = []
        if named:
            named = Path(str(named)).expanduser()
            candidates += [named] if named.is_absolute() else [Path.cwd() / named, self.path / named]
        candidates.append(self.path / kind)
        return next((c for c in candidates if c.is_dir()), None)

    def dump_steps(self, kind: str) -> list[int]:
        """The steps with a dump file (`<step>.jsonl`), ascending."""
        folder = self.dump_dir(kind)
        return [] if folder is None else dump_steps(folder)

    def samples(self, kind: str, step: int) -> list[dict]:
        folder = self.dump_dir(kind)
        return [] if folder is None else read_jsonl(dump_file(folder, step))

    def metrics(self) -> list[dict]:
        """metrics.jsonl's lines that have a step (a resumed run's file holds each step once)."""
        return [row for row in read_jsonl(self.path / METRICS_FILE) if isinstance(row.get(STEP), int)]

    def summary(self) -> dict:
        """What the page needs to list the run: its name, folder and the steps of each dump."""
        return {
            "name": self.name,
            "path": str(self.path),
            "steps": {kind: self.dump_steps(kind) for kind in DUMP_KINDS},
            "sft": self.is_sft(),
        }

    def is_sft(self) -> bool:
        """A `tandem sft` run (its metrics are sft/*): it generates nothing, so it has no sample dumps."""
        return any(SFT_METRIC in row for row in self.metrics())


def open_runs(folders: list[str | Path]) -> list[Run]:
    """The runs of the folders given on the command line, named by their folder's last part (and its
    parent's where two would read alike). Raises RunFolderError for a folder that is not a run's."""
    paths = []
    for folder in folders:
        path = Path(folder).expanduser().resolve()
        if not path.is_dir():
            raise RunFolderError(f"{folder}: no such folder; give the run folder (it holds config.yaml)")
        if not (path / CONFIG_FILE).exists() and not (path / METRICS_FILE).exists():
            raise RunFolderError(
                f"{folder}: no config.yaml or metrics.jsonl in it; give the run folder, "
                "<trainer.output_dir>/<project_name>/<experiment_name> (runs/tandem/grpo by default)"
            )
        paths.append(path)
    names = [p.name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.parent.name}/{p.name}" for p in paths]
    if len(set(names)) < len(names):
        names = [str(p) for p in paths]
    return [Run(path, name) for path, name in zip(paths, names)]

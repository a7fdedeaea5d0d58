"""Where a run's metrics go (trainer.loggers): console lines, metrics.jsonl, TensorBoard, wandb, mlflow;
and the progress bar with the ETA.

    <log_dir>/metrics.jsonl    jsonl: {"step": 3, "time": "2026-11-23T22:03:44.120+00:00", "score/mean": 0.5, ...}
                               per line (time: when the line was logged), non-finite -> null
    <log_dir>/val_generations.jsonl   jsonl, with trainer.log_val_generations: one line per logged sample
                               (`log_generations`); TensorBoard text, a W&B table, MLflow artifacts likewise
    <log_dir>/tensorboard/     tensorboard event files
    <log_dir>/wandb/           wandb, offline unless WANDB_MODE says otherwise
    <log_dir>/mlruns/          mlflow file store, unless MLFLOW_TRACKING_URI is set

Progress: on a terminal, a live tqdm bar on stderr. Without one (a cluster job's log file) a live bar
would write a carriage-return redraw per update, so instead each console line carries the percentage,
elapsed time and ETA (or, without the console logger, a one-line status goes to stderr per log call).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import math
import numbers
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from tandem.run_folder import METRICS_FILE, VAL_GENERATIONS_FILE

logger = logging.getLogger(__name__)

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")

# The trainer's headline metrics (names as in tandem/trainer/metrics.py); missing ones are skipped.
DEFAULT_CONSOLE_KEYS = (
    "score/mean",
    "val/acc",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "critic/vf_loss",
    "response_length/mean",
    "timing_s/step",
)

# loggers that need a package of the same name (module and pip install alike)
_NEEDS_PACKAGE = ("tensorboard", "wandb", "mlflow")
_STATUS_EVERY_S = 10.0  # without a terminal or console logger: a status line at most this often
_MLFLOW_MAX_PARAM_CHARS = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH; longer values are cut

Number = int | float
Sink = Callable[[dict[str, Number], int], None]
TextSink = Callable[[list[dict[str, Any]], int], None]
GENERATION_COLUMNS = ("sample", "data_source", "input", "output", "gts", "score")  # W&B's table, TensorBoard


class Tracker:
    """Sends each step's metrics to the chosen loggers. `step` counts training steps from 1 (0 = validation
    before training); `start_step` is the step a resumed run continues after (0 = a fresh run)."""

    def __init__(
        self,
        loggers: Sequence[str],
        *,
        log_dir: str | Path,
        project: str,
        experiment: str,
        config: dict[str, Any] | None = None,
        total_steps: int | None = None,
        start_step: int = 0,
        console_keys: Sequence[str] | None = None,
        progress: bool = True,
    ) -> None:
        chosen = list(dict.fromkeys(loggers))
        _check_loggers(chosen)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps = total_steps
        self.start_step = start_step
        self.console_keys = tuple(DEFAULT_CONSOLE_KEYS if console_keys is None else console_keys)
        self._failed = False  # set by __exit__ on an exception: wandb / mlflow mark the run failed
        self._started = time.monotonic()
        self._now = datetime.datetime.now().astimezone()
        self._stack = ExitStack()
        self._sinks: list[Sink] = []
        self._text_sinks: list[tuple[str, TextSink]] = []  # (logger, sink) for log_generations
        self._bar: tqdm | None = None
        show_progress = progress and total_steps is not None
        if show_progress and _isatty(sys.stderr):
            # mininterval: fast steps (SFT on a tiny model) redraw the bar at most once a second
            bar = tqdm(total=total_steps, initial=start_step, file=sys.stderr, unit="step", mininterval=1.0)
            self._bar = self._stack.enter_context(bar)
        self._eta_in_lines = show_progress and self._bar is None
        self._console = "console" in chosen
        self._last_status = -float("inf")
        try:
            opener = {
                "jsonl": self._open_jsonl,
                "tensorboard": self._open_tensorboard,
                "wandb": self._open_wandb,
                "mlflow": self._open_mlflow,
            }
            for name in chosen:
                if name != "console":
                    self._sinks.append(opener[name](project, experiment, config or {}))
        except BaseException:
            self.close()
            raise

    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        """Record `metrics` at `step` in every logger; values that are not numbers are skipped."""
        values = {key: n for key, value in metrics.items() if (n := _as_number(value)) is not None}
        self._now = datetime.datetime.now().astimezone()  # one wall-clock time for every logger's line
        for sink in self._sinks:
            sink(values, step)
        if self._console:
            shown = [f"{key}={_short(values[key])}" for key in self.console_keys if key in values]
            self._write_line(" ".join([self._step_label(step), *shown, self._eta(step)]).rstrip(), sys.stdout)
        elif self._eta_in_lines and self._status_due(step):
            self._write_line(f"{self._step_label(step)} {self._eta(step)}", sys.stderr)
        if self._bar is not None and step > self._bar.n:
            self._bar.update(step - self._bar.n)

    def log_generations(self, rows: Sequence[dict[str, Any]], step: int) -> None:
        """Record validation samples (dicts of the sample dumps' fields) at `step` in every logger that
        takes text: jsonl, tensorboard, wandb, mlflow. A logger that fails is a warning, never a failed run."""
        for name, sink in self._text_sinks:
            try:
                sink(list(rows), step)
            except Exception as err:
                logger.warning("%s could not log the validation generations of step %d: %s", name, step, err)

    def close(self) -> None:
        """Flush and close every logger; safe to call more than once."""
        self._stack.close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._failed = exc_type is not None
        self.close()

    # ---- console ---------------------------------------------------------------------------------------

    def _step_label(self, step: int) -> str:
        """'22:03:44 [step 3/40]': the wall-clock time of the line, then the step."""
        clock = self._now.strftime("%H:%M:%S")
        return (
            f"{clock} [step {step}]"
            if self.total_steps is None
            else f"{clock} [step {step}/{self.total_steps}]"
        )

    def _status_due(self, step: int) -> bool:
        """A status line (no console logger, no terminal) for the first and last step and every
        _STATUS_EVERY_S in between: a log file gets a pulse, not a line per fast step."""
        now = time.monotonic()
        if step in (self.start_step + 1, self.total_steps) or now - self._last_status >= _STATUS_EVERY_S:
            self._last_status = now
            return True
        return False

    def _eta(self, step: int) -> str:
        """'[8% 00:12<02:20]' (done, elapsed < remaining) when no live bar shows it, else ''."""
        if not self._eta_in_lines:
            return ""
        elapsed = time.monotonic() - self._started
        # initial=start_step: the rate counts this process's steps, not those done before a resume
        meter = "[{percentage:.0f}% {elapsed}<{remaining}]"
        return tqdm.format_meter(step, self.total_steps, elapsed, initial=self.start_step, bar_format=meter)

    def _write_line(self, line: str, file: TextIO) -> None:
        if self._bar is not None:
            self._bar.write(line, file=file)  # clears the bar, prints, redraws it below
        else:
            print(line, file=file, flush=True)

    # ---- the other loggers: each returns its sink and registers its close on the stack ------------------

    def _open_jsonl(self, project: str, experiment: str, config: dict[str, Any]) -> Sink:
        path = self.log_dir / METRICS_FILE
        if self.start_step > 0:
            _drop_steps_after(path, self.start_step)
        mode = "a" if self.start_step > 0 else "w"  # a fresh run starts a fresh file
        file = self._stack.enter_context(path.open(mode, encoding="utf-8"))

        def write(values: dict[str, Number], step: int) -> None:
            row: dict[str, Number | str | None] = {
                "step": step,
                "time": self._now.isoformat(timespec="milliseconds"),
            }
            row.update((k, v if math.isfinite(v) else None) for k, v in values.items() if k != "step")
            file.write(json.dumps(row, allow_nan=False) + "\n")
            file.flush()

        generations = self.log_dir / VAL_GENERATIONS_FILE
        if self.start_step > 0:
            _drop_steps_after(generations, self.start_step)
        elif generations.exists():
            generations.unlink()  # a fresh run starts a fresh file
        self._text_sinks.append(("jsonl", lambda rows, step: _append_jsonl(generations, rows, step)))
        return write

    def _open_tensorboard(self, project: str, experiment: str, config: dict[str, Any]) -> Sink:
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run hides the events it is about to rewrite (the steps after its checkpoint).
        purge_step = self.start_step + 1 if self.start_step > 0 else None
        writer = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"), purge_step=purge_step)
        self._stack.callback(writer.close)

        def write(values: dict[str, Number], step: int) -> None:
            for key, value in values.items():
                if math.isfinite(value):
                    writer.add_scalar(key, value, step)
            writer.flush()

        def write_text(rows: list[dict[str, Any]], step: int) -> None:
            writer.add_text("val/generations", _markdown(rows), step)
            writer.flush()

        self._text_sinks.append(("tensorboard", write_text))
        return write

    def _open_wandb(self, project: str, experiment: str, config: dict[str, Any]) -> Sink:
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")
        run = wandb.init(project=project, name=experiment, config=config, dir=str(self.log_dir), mode=mode)
        self._stack.callback(lambda: run.finish(exit_code=1 if self._failed else 0))
        table_rows: list[list[Any]] = []  # a W&B table is logged whole: every step's rows so far

        def write_table(rows: list[dict[str, Any]], step: int) -> None:
            table_rows.extend([step, *(_cell(row.get(c)) for c in GENERATION_COLUMNS)] for row in rows)
            table = wandb.Table(columns=["step", *GENERATION_COLUMNS], data=table_rows)
            run.log({"val/generations": table}, step=step)

        self._text_sinks.append(("wandb", write_table))
        return lambda values, step: run.log(dict(values), step=step)

    def _open_mlflow(self, project: str, experiment: str, config: dict[str, Any]) -> Sink:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (self.log_dir.resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):
            # MLflow 3 refuses its file store unless opted in; a local folder needs no database server.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(uri)
        found = client.get_experiment_by_name(project)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(project)
        run_id = client.create_run(experiment_id, run_name=experiment).info.run_id
        self._stack.callback(lambda: client.set_terminated(run_id, "FAILED" if self._failed else "FINISHED"))
        params = [Param(k, v[:_MLFLOW_MAX_PARAM_CHARS]) for k, v in _flatten(config).items()]
        client.log_batch(run_id, params=params)

        def write(values: dict[str, Number], step: int) -> None:
            now_ms = int(time.time() * 1000)
            metrics = [Metric(k, float(v), now_ms, step) for k, v in values.items()]
            client.log_batch(run_id, metrics=metrics)

        def write_artifact(rows: list[dict[str, Any]], step: int) -> None:
            client.log_dict(run_id, {"step": step, "samples": rows}, f"val_generations/step_{step:06d}.json")

        self._text_sinks.append(("mlflow", write_artifact))
        return write


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl file, in file order."""
    rows = []
    with open(path, encoding="utf-8") as file:
        for lineno, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path} line {lineno} is not JSON ({err}); remove or fix that line"
                ) from err
    return rows


def _check_loggers(chosen: Sequence[str]) -> None:
    """Fail at start-up, before any file is opened, on an unknown logger or a missing package."""
    unknown = [name for name in chosen if name not in LOGGERS]
    if unknown:
        raise ValueError(f"trainer.loggers has unknown {unknown}; choose from {list(LOGGERS)}")
    for name in chosen:
        if name in _NEEDS_PACKAGE and importlib.util.find_spec(name) is None:
            raise RuntimeError(
                f"trainer.loggers has '{name}' but the {name} package is not installed: "
                f"`pip install {name}`, or remove '{name}' from trainer.loggers"
            )


def _drop_steps_after(path: Path, start_step: int) -> None:
    """Keep the rows up to `start_step`: a resumed run writes the later steps again. Atomic (temp + replace)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line torn by the killed run, or not a metrics row
        if isinstance(step, int) and step <= start_step:
            kept.append(line if line.endswith("\n") else line + "\n")
    temp = path.with_name(path.name + ".tmp")
    temp.write_text("".join(kept), encoding="utf-8")
    os.replace(temp, path)


def _append_jsonl(path: Path, rows: list[dict[str, Any]], step: int) -> None:
    with path.open("a", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps({**row, "step": step}, ensure_ascii=False) + "\n")


def _cell(value: Any) -> Any:
    """A table cell: text and numbers as they are, anything else as JSON."""
    return value if value is None or isinstance(value, str | int | float) else json.dumps(value)


def _markdown(rows: list[dict[str, Any]]) -> str:
    """Validation samples as TensorBoard's text plugin shows them: a heading per sample, texts verbatim."""
    parts = []
    for row in rows:
        head = f"### sample {row.get('sample')} · {row.get('data_source')} · score {row.get('score')}"
        gts = f"ground truth: `{row.get('gts')}`"
        texts = [
            f"**{key}**\n\n    " + str(row.get(key, "")).replace("\n", "\n    ")
            for key in ("input", "output")
        ]
        parts.append("\n\n".join([head, gts, *texts]))
    return "\n\n---\n\n".join(parts)


def _as_number(value: object) -> Number | None:
    """`value` as a Python int or float (numpy scalars and one-element tensors too); None when not a number."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # numpy 0-d arrays, numpy bools, one-element tensors
    if not callable(item):
        return None
    try:
        inner = item()
    except (ValueError, RuntimeError, TypeError):  # more than one element
        return None
    return _as_number(inner) if isinstance(inner, numbers.Real) else None


def _short(value: Number) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config as dotted keys -> string values (what mlflow params hold)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= _flatten(value, name + ".")
        else:
            flat[name] = str(value)
    return flat


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())

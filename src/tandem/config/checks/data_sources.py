"""The rows' data_source values against the reward scorers, checked from the config alone: at `tandem config`,
and by `tandem train` / `tandem eval` before they read the data or start any worker.

Every row of data.train_files and data.val_files is scored by the scorer its data_source names (a built-in or
registered scorer, by name or alias), else by the one its extra_info.style names; reward.custom_reward_file
scores every data_source. With reward.reward_model.enable a data_source no rule scorer covers is scored by the
reward model alone (rule score 0, rewards/manager.py), as verl scores every sample when its reward model is on. Only the data_source column is read (and extra_info.style, where a value has no
scorer), so a large parquet file costs little. A file that is not there or cannot be read is not checked
(its own check, or the data loader, says what is wrong with it).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem.config.errors import ConfigError, closest

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig

SOURCE = "data_source"
STYLE = ("extra_info", "style")

# (data_source, extra_info.style) -> rows; a data_source that is not a string is kept as it is
SourceCounts = Counter[tuple[Any, Any]]
FirstRows = dict[tuple[Any, Any], int]  # the same keys -> the index of the first row with them
MISSING = "(no data_source field)"  # the key of rows without the field (a name no task has: it holds spaces)


@dataclass
class DataSourceReport:
    """What the check found: `problems` (one line each, naming key, file, data_source and rows) and `unchecked`
    (files it could not read, and why)."""

    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


def data_source_report(cfg: TandemConfig) -> DataSourceReport:
    """Each data_source of the configured files that no reward scorer covers, per file, with the fix."""
    report = DataSourceReport()
    # the user's function scores every data_source; a reward-manager class of the user's decides itself
    if cfg.reward.custom_reward_file or cfg.reward.manager_source == "importlib":
        return report
    # the rows are those of a user's class: checked as they are read (trainer/ppo.py)
    if cfg.data.custom_dataset_file:
        report.unchecked.append(
            f"data.train_files, data.val_files: the rows are made by data.custom_dataset_class="
            f"{cfg.data.custom_dataset_class}, checked when tandem train reads them"
        )
        return report
    # with a reward model on, a data_source no rule scorer covers is scored by the model alone (rule score 0)
    model_only = cfg.reward.reward_model.enable
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        for path in files:
            try:
                counts, first, total = read_sources(path)
            except _Unreadable as why:
                report.unchecked.append(f"{key}: {path}: {why}")
                continue
            # the scorers, once a file is read: tandem.rewards loads torch, which `tandem config` spares otherwise
            from tandem.rewards.registry import known_data_sources, scorer_name_for

            for (source, style), rows in sorted(counts.items(), key=lambda item: (str(item[0]), -item[1])):
                where = f" (first: {Path(path).name} row {first[(source, style)]})"
                if source == MISSING:
                    report.problems.append(
                        f"{key}: {path}: {rows} of {total} rows have no data_source field; every "
                        f"row needs one: the task's name, which picks its reward scorer{where}"
                    )
                elif not isinstance(source, str) or not source.strip():
                    report.problems.append(
                        f"{key}: {path}: {rows} of {total} rows have data_source {source!r}; every "
                        f"row needs one: the task's name, which picks its reward scorer{where}"
                    )
                elif (
                    not model_only
                    and scorer_name_for(source, style if isinstance(style, str) else None) is None
                ):
                    close = closest(source, known_data_sources())
                    hint = f" (did you mean '{close}'?)" if close else ""
                    styled = f" and extra_info.style {style!r}" if style is not None else ""
                    report.problems.append(
                        f"{key}: {path}: {rows} of {total} rows have data_source '{source}'{styled}, "
                        f"which no reward scorer covers{hint}{where}"
                    )
    if any("no reward scorer covers" in p for p in report.problems):
        report.problems.append(_fix(known_data_sources()))
    return report


def check_data_sources(cfg: TandemConfig) -> list[str]:
    """Raise ConfigError for rows no reward scorer covers (data_source_report); returns the files not checked."""
    report = data_source_report(cfg)
    if report.problems:
        raise ConfigError(report.problems)
    return report.unchecked


def _fix(known: list[str]) -> str:
    return (
        f"to score these rows: give them a data_source with a built-in scorer ({', '.join(known)}), or set "
        "extra_info.style to a scorer's name (e.g. math), or score them with your own function: "
        "reward.custom_reward_file=path/to/file.py reward.custom_reward_function=compute_score (verl's "
        "custom_reward_function.path and custom_reward_function.name)"
    )


class _Unreadable(Exception):
    """A data file the check cannot read; the message says why."""


def read_sources(path: str) -> tuple[SourceCounts, FirstRows, int]:
    """(rows per (data_source, extra_info.style), the first row index of each, rows) of one parquet or jsonl
    file; style is None unless the data_source has no scorer of its own (it is only read then). Raises
    _Unreadable."""
    if "://" in path:
        raise _Unreadable("a remote file, not read here")
    file = Path(path).expanduser()
    if not file.is_file():
        raise _Unreadable("not there (yet)" if not file.exists() else "not a file")
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        return _parquet_sources(file)
    if suffix == ".jsonl":
        return _jsonl_sources(file)
    raise _Unreadable(f"not a .parquet or .jsonl file (suffix {suffix or 'none'!r})")


def _parquet_sources(file: Path) -> tuple[SourceCounts, FirstRows, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(file)
        if SOURCE not in schema.names:
            rows = pq.ParquetFile(file).metadata.num_rows
            return Counter({(MISSING, None): rows}), {(MISSING, None): 0}, rows
        sources = pq.read_table(file, columns=[SOURCE]).column(SOURCE).to_pylist()
        styles: list[Any] = [None] * len(sources)
        if _has_style(schema) and any(_without_scorer(set(sources)).values()):
            styles = pq.read_table(file, columns=[".".join(STYLE)]).column(0).to_pylist()
    except (pa.ArrowException, OSError) as error:
        raise _Unreadable(f"not a readable parquet file ({error})") from None
    return *_count(sources, styles), len(sources)


def _has_style(schema: Any) -> bool:
    import pyarrow as pa

    if STYLE[0] not in schema.names:
        return False
    kind = schema.field(STYLE[0]).type
    return pa.types.is_struct(kind) and kind.get_field_index(STYLE[1]) >= 0


def _jsonl_sources(file: Path) -> tuple[SourceCounts, FirstRows, int]:
    sources, styles = [], []
    try:
        with file.open(encoding="utf-8-sig") as lines:
            for line in lines:
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise _Unreadable("a line is not a JSON object")
                extra = row.get(STYLE[0])
                sources.append(row.get(SOURCE, MISSING))
                styles.append(extra.get(STYLE[1]) if isinstance(extra, dict) else None)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _Unreadable(f"not readable as jsonl ({error})") from None
    return *_count(sources, styles), len(sources)


def _without_scorer(sources: set[Any]) -> dict[Any, bool]:
    """For each value: whether it is a data_source name (not MISSING) with no scorer of its own."""
    from tandem.rewards.registry import scorer_name_for

    return {s: isinstance(s, str) and s != MISSING and scorer_name_for(s) is None for s in sources}


def _count(sources: list[Any], styles: list[Any]) -> tuple[SourceCounts, FirstRows]:
    """Rows per (data_source, style), the style kept only where the data_source has no scorer of its own, and
    the index of the first row of each (counted among the file's rows, blank jsonl lines left out)."""
    needs = _without_scorer({s for s in sources if isinstance(s, str)})
    counts: SourceCounts = Counter()
    first: FirstRows = {}
    for index, (source, style) in enumerate(zip(sources, styles, strict=True)):
        if isinstance(source, list | dict):  # jsonl: not a name, and unhashable
            source = (json.dumps(source),)
        key = (source, style if needs.get(source) else None)
        counts[key] += 1
        first.setdefault(key, index)
    return counts, first

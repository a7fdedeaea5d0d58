"""The rows of the run's data against its scorers: every row's data_source has a scorer, and every row's ground
truth suits the scorer of its data_source; a bad row is a DataError naming its file, row and field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tandem.data.rows import DataError
from tandem.rewards.registry import UnknownDataSourceError

GROUND_TRUTH_FIELD = "reward_model.ground_truth"
MAX_LISTED_ROWS = 5  # rows named in a ground-truth error


def _found(data: Any, i: int, value: Any) -> str:
    if value is None:
        return f"the row has no {GROUND_TRUTH_FIELD}" if i in data.ground_truth_absent else "it is null"
    return f"found {value!r:.80} ({type(value).__name__})"


def check_ground_truths(rewards: Any, datasets: Iterable[Any]) -> None:
    """Every row's ground truth must suit the scorer of its data_source (the scorer's declared check,
    see tandem/rewards/registry.py); else a DataError naming the file, row and field of each bad row."""
    problems = []
    for data in datasets:
        if data is None:
            continue
        rows = []
        for i in range(len(data)):
            item = data[i]
            style = item["extra_info"].get("style")
            rows.append(
                (item["data_source"], style if isinstance(style, str) else None, item["ground_truth"])
            )
        for i, scorer, problem in rewards.ground_truth_problems(rows):
            data_source, _, value = rows[i]
            problems.append(
                f"{data.locations[i]}: field '{GROUND_TRUTH_FIELD}' (data_source '{data_source}', scored by "
                f"{scorer}): {problem}; {_found(data, i, value)}"
            )
    if not problems:
        return
    listed = "\n".join(f"  - {p}" for p in problems[:MAX_LISTED_ROWS])
    more = f"\n  ... and {len(problems) - MAX_LISTED_ROWS} more" if len(problems) > MAX_LISTED_ROWS else ""
    raise DataError(
        f"{len(problems)} row(s) hold a ground truth their scorer cannot use (each would score 0 on every "
        f"sample):\n{listed}{more}\nFix the rows' {GROUND_TRUTH_FIELD}, or give the data_source a scorer that "
        "reads it (reward.custom_reward_file)"
    )


def check_item_data_sources(rewards: Any, datasets: Iterable[Any]) -> None:
    """Every row's data_source has a scorer, naming the first row of each that has none. For rows a user's
    dataset class made (data.custom_dataset_file): rows read from files are checked from the files before they
    are read (config/checks/data_sources.py)."""
    first: dict[tuple[Any, str | None], str] = {}
    for data in datasets:
        for i in range(len(data) if data is not None else 0):
            style = data[i]["extra_info"].get("style")
            key = (data[i]["data_source"], style if isinstance(style, str) else None)
            first.setdefault(key, data.locations[i])
    problems = []
    for source, location in first.items():
        try:
            rewards.check_data_sources([source])
        except UnknownDataSourceError as error:
            problems.append(f"{location}: {error.args[0]}")
    if problems:
        raise UnknownDataSourceError("\n".join(problems))

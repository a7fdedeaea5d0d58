"""`tandem generate`: n samples per prompt of a parquet file on the rollout engine, written as verl's
`main_generation` writes them: the input's columns plus `responses`, per row the list of its n response
texts (decoded without special tokens), in `output_path`. Two more columns, `response_lengths` (tokens)
and `finish_reasons` (`stop`: the end-of-sequence token; `length`: max_response_length reached), unless
extra_columns=false.

The engine (vLLM, or Hugging Face generate) is fed `batch_size` consecutive rows at a time: one engine in
this process, or several side by side on Ray, each dealt whole batches (`commands/generate_replicas.py`;
the layout: `config.generate.generate_layout`). Each finished batch is written to `<output_path>.parts/` at
once; a run that stops (Ctrl-C, a crash, a lost machine) and is started again with the same settings skips
the batches there, and the final file is the one an uninterrupted run writes, with any number of replicas.

Seeds: sample j of row i (its row number in the file, from 0) draws from a generator seeded by `seed` and
its key i x n + j alone (`rollout.base.sample_keys`; vLLM: one request seed per sample,
`rollout.base.request_seed`), never by the batch or the replica it ran on. The parts folder is removed once
the output is written.

`plan_generation` runs the start-up checks alone (the tokenizer, every prompt, the output and its parts
folder), writing nothing and building no engine: `tandem generate --check`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from tandem.batch import Batch
from tandem.config.errors import ConfigError
from tandem.config.generate import GenerateConfig, GenerateLayout, check_engine_layout, generate_layout
from tandem.data.generation import generation_items
from tandem.data.prompts import collate_prompts
from tandem.models.config_overrides import text_config
from tandem.rollout import PROMPT_INDEX, RolloutEngine, RolloutSpec, SamplingParams, build_rollout
from tandem.rollout.base import read_special_ids
from tandem.rollout_options import facts, resolve_engine
from tandem.trainer.start_checks.tokenizers import load_tokenizer

RESPONSES = "responses"  # verl's column
EXTRA_COLUMNS = ("response_lengths", "finish_reasons")
PARTS_META = "generate.json"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parts_folder(output_path: str | Path) -> Path:
    """Where the finished batches of a generation into `output_path` wait for the rest."""
    output = Path(output_path)
    return output.with_name(output.name + ".parts")


@dataclass(frozen=True)
class GenerationPlan:
    """What a run of a config would do, as its start-up checks found it; nothing written, no engine built."""

    tokenizer: Any
    items: list[dict[str, Any]]  # one per prompt row (`data.generation.generation_items`)
    batches: list[range]  # the rows of each engine call, and of each part of `parts`
    layout: GenerateLayout  # the engines: replicas x tensor_parallel devices
    spec: RolloutSpec  # what the engine would be built from (engine=auto resolved)
    fingerprint: dict[str, Any]  # what the parts depend on: a resumed run must match it
    parts: Path
    done: set[int]  # the batches an interrupted run finished in `parts`, which this run skips

    def summary(self, cfg: GenerateConfig) -> str:
        """A few lines: the work, the engine and device, the output (and what becomes of one there)."""
        rows, batches, spec = len(self.items), len(self.batches), self.spec
        dtype = str(spec.dtype).removeprefix("torch.")
        max_model_len = f", max_model_len {spec.max_model_len}" if facts(spec.engine).max_model_len else ""
        lines = [
            f"{rows} prompts x n={cfg.n} = {rows * cfg.n} samples of up to {cfg.max_response_length} tokens, "
            f"in {batches} batch{'es' if batches != 1 else ''} of up to {cfg.batch_size} prompts",
            f"model {cfg.model_path}, engine {spec.engine} on {spec.device} ({dtype}){max_model_len}"
            + ("" if self.layout.in_process else f": {self.layout.describe(spec.device.type)}, on Ray"),
        ]
        if self.done:
            lines.append(f"resumes {self.parts}: {len(self.done)} of {batches} batches done")
        elif cfg.overwrite and (Path(cfg.output_path).exists() or self.parts.exists()):
            lines.append(f"writes {cfg.output_path}, replacing what is there (overwrite)")
        else:
            lines.append(f"writes {cfg.output_path}")
        return "\n".join(f"tandem generate: {line}" for line in lines)


def check_output_location(output_path: str, key: str) -> None:
    """The output and its `<output>.parts` folder can be written where `output_path` points: its nearest existing
    folder is a folder, and a file can be made in it. A ConfigError naming `key` otherwise, before the model
    loads (not an OSError about the parts folder after the first batch)."""
    output = Path(output_path).expanduser().absolute()
    folder = output.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{key}={output_path}: {folder} is a file, not a folder; give a path in a folder")
    try:
        probe, name = tempfile.mkstemp(prefix=".tandem_write_check_", dir=folder)
    except OSError as err:
        raise ConfigError(
            f"{key}={output_path}: cannot write in {folder} ({err.strerror or err}); give a path in a folder you "
            "can write"
        ) from None
    os.close(probe)
    os.unlink(name)


def plan_generation(cfg: GenerateConfig, *, key_names: Mapping[str, str] | None = None) -> GenerationPlan:
    """The start-up checks of `run_generation`, with nothing written and no engine built: the tokenizer
    loads, every prompt renders within max_prompt_length (or is cut), and the output is new, replaced
    (overwrite) or resumed with the same settings. Raises the ConfigError or DataError the run would.

    Args:
        cfg: the checked config (`config.generate.load_generate_config`).
        key_names: config key -> the key as the user wrote it (a verl key), for the messages.
    """
    names = dict(key_names or {})
    check_output_location(cfg.output_path, names.get("output_path", "output_path"))
    tokenizer_key = "tokenizer_path" if cfg.tokenizer_path else "model_path"
    tokenizer = load_tokenizer(cfg.tokenizer_path or cfg.model_path, names.get(tokenizer_key, tokenizer_key))
    items = generation_items(
        cfg.data_path,
        tokenizer,
        prompt_key=cfg.prompt_key,
        max_prompt_length=cfg.max_prompt_length,
        truncation=cfg.truncation,
        chat_template=cfg.chat_template,
        chat_template_kwargs=cfg.chat_template_kwargs,
        key_names=names,
    )
    device = torch.device(
        cfg.device if cfg.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    )
    engine = resolve_engine(cfg.engine)
    layout = generate_layout(cfg, names)
    check_engine_layout(engine, layout, cfg.engine, names)
    batches = [
        range(first, min(first + cfg.batch_size, len(items)))
        for first in range(0, len(items), cfg.batch_size)
    ]
    fingerprint = _fingerprint(cfg, items, engine)
    parts = parts_folder(cfg.output_path)
    done = _done_batches(parts, Path(cfg.output_path), fingerprint, cfg.overwrite, len(batches), names)
    spec = _engine_spec(cfg, engine, device)
    return GenerationPlan(tokenizer, items, batches, layout, spec, fingerprint, parts, done)


def run_generation(
    cfg: GenerateConfig,
    *,
    key_names: Mapping[str, str] | None = None,
    build_engine: Callable[[RolloutSpec], RolloutEngine] = build_rollout,
    on_part: Callable[[int, int | None], None] | None = None,
) -> Path:
    """Generate, resume or start over as `cfg` says; returns the output path.

    Args:
        cfg: the checked config (`config.generate.load_generate_config`).
        key_names: config key -> the key as the user wrote it (a verl key), for the messages.
        build_engine: `build_rollout(spec)`, for the engine in this process (one engine on one
            device); tests wrap it.
        on_part: called with (batch, replica; None in this process) after each part is written; tests use
            it to stop a run as a kill would.
    """
    names = dict(key_names or {})
    plan = plan_generation(cfg, key_names=names)
    print(plan.summary(cfg), file=sys.stderr, flush=True)  # before the engine's start-up, which takes a while
    tokenizer, items, batches, parts, done = plan.tokenizer, plan.items, plan.batches, plan.parts, plan.done
    output = Path(cfg.output_path)
    if not plan.layout.in_process:
        from tandem.commands.generate_replicas import check_devices, generate_on_replicas

        check_devices(plan.layout, plan.spec.device.type, cfg, names)
    _start_parts(parts, plan.fingerprint, cfg.overwrite)
    todo = [i for i in range(len(batches)) if i not in done]
    if todo:
        sampling = SamplingParams(
            max_tokens=cfg.max_response_length,
            n=cfg.n,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            seed=cfg.seed,
        )
        show_bar = cfg.progress_bar and sys.stderr.isatty()
        bar = tqdm(
            total=len(items),
            initial=sum(len(batches[i]) for i in done),
            unit="prompt",
            file=sys.stderr,
            disable=not show_bar,
        )
        started = time.perf_counter()

        def write(batch: int, out: Mapping[str, Any], eos_ids: set[int]) -> None:
            rows = batches[batch]
            _write_part(parts, batch, rows, _decode(out, tokenizer, cfg.n, eos_ids))
            bar.update(len(rows))
            if not show_bar and cfg.progress_bar:
                where = f" (replica {out['replica']})" if "replica" in out else ""
                print(
                    f"tandem generate: batch {batch + 1}/{len(batches)}{where}: {len(rows)} prompts x {cfg.n}, "
                    f"{time.perf_counter() - started:.1f} s in",
                    file=sys.stderr,
                )
            if on_part is not None:
                on_part(batch, out.get("replica"))

        with bar:
            if plan.layout.in_process:
                engine = build_engine(plan.spec)
                pad_id, eos_ids = engine.pad_token_id, set(engine.eos_token_ids)
                for i in todo:
                    rows = batches[i]
                    prompts = collate_prompts([items[r] for r in rows], pad_id)
                    prompts[PROMPT_INDEX] = torch.tensor(
                        list(rows)
                    )  # seeds each row's samples by its row alone
                    write(i, engine.generate(prompts, sampling), eos_ids)
            else:
                stop_ids, pad_id = read_special_ids(cfg.model_path, cfg.tokenizer_path, tokenizer)
                generate_on_replicas(
                    plan.layout,
                    plan.spec,
                    items,
                    batches,
                    todo,
                    sampling,
                    pad_id,
                    lambda batch, out: write(batch, out, set(stop_ids)),
                    cpus_per_worker=cfg.cpus_per_worker,
                    ray_address=cfg.ray_address,
                )
    _write_output(cfg, output, parts, len(batches), len(items))
    shutil.rmtree(parts)
    return output


def _engine_spec(cfg: GenerateConfig, engine: str, device: torch.device) -> RolloutSpec:
    """The engine's spec from tandem generate's config (`engine`: resolved). Unlike training, the dtype is the
    config's (auto: bfloat16 on a GPU), and where the engine bounds a sequence's length (vLLM) the bound stops at
    the model's own positions: verl leaves vLLM's max_model_len to the model's limit, so a long prompt_length
    (verl's default 1536 + 512) must not make vLLM refuse a model of 2048 positions whose prompts are short."""
    dtype = (
        DTYPES[cfg.dtype]
        if cfg.dtype != "auto"
        else torch.bfloat16
        if device.type == "cuda"
        else torch.float32
    )
    max_model_len = cfg.max_prompt_length + cfg.max_response_length
    if facts(engine).max_model_len:
        positions = (text_config(cfg.model_path) or {}).get("max_position_embeddings")
        max_model_len = min(max_model_len, positions or 1 << 30)
    return RolloutSpec(
        engine=engine,
        model_path=cfg.model_path,
        tokenizer_path=cfg.tokenizer_path,
        device=device,
        dtype=dtype,
        max_model_len=max_model_len,
        tensor_parallel=cfg.tensor_parallel,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        kv_cache_gib=cfg.cpu_kv_cache_gib,
        seed=cfg.seed,
        engine_kwargs=cfg.engine_kwargs,
    )


def _decode(out: Batch, tokenizer: Any, n: int, eos_ids: set[int]) -> dict[str, list[list[Any]]]:
    """Per prompt, its n response texts (as verl decodes them: without special tokens), token counts and
    finish reasons."""
    lengths = out["response_mask"].sum(dim=1).tolist()
    texts, reasons = [], []
    for ids, length in zip(out["responses"].tolist(), lengths, strict=True):
        texts.append(tokenizer.decode(ids[:length], skip_special_tokens=True))
        reasons.append("stop" if length and ids[length - 1] in eos_ids else "length")
    group = range(0, len(texts), n)
    return {
        RESPONSES: [texts[k : k + n] for k in group],
        "response_lengths": [[int(x) for x in lengths[k : k + n]] for k in group],
        "finish_reasons": [reasons[k : k + n] for k in group],
    }


def _fingerprint(cfg: GenerateConfig, items: list[dict[str, Any]], engine: str) -> dict[str, Any]:
    """What the parts of a run depend on: a resumed run must match it."""
    prompts = hashlib.sha256(json.dumps([item["input_ids"] for item in items]).encode()).hexdigest()
    keys = (
        "model_path",
        "n",
        "batch_size",
        "max_response_length",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "dtype",
    )
    return {
        "prompts": f"{len(items)} rows, sha256 {prompts[:16]}",
        **{key: getattr(cfg, key) for key in keys},
        "engine": engine,
        "model_path": str(Path(cfg.model_path).resolve()),
    }


def _done_batches(
    parts: Path,
    output: Path,
    fingerprint: dict[str, Any],
    overwrite: bool,
    batches: int,
    names: Mapping[str, str],
) -> set[int]:
    """The batches an interrupted run finished in `parts` (none with overwrite), after checking they were
    made the same way; an output that exists is an error unless overwrite. Reads only."""
    meta = parts / PARTS_META
    if not overwrite and meta.is_file():
        before = json.loads(meta.read_text())
        changed = [
            f"{k}: {before.get(k)!r} then, {v!r} now" for k, v in fingerprint.items() if before.get(k) != v
        ]
        if changed:
            raise ConfigError(
                f"{parts} holds the finished batches of an interrupted generation into {output} made with other "
                f"settings ({'; '.join(changed)}): give the same settings to resume it, or overwrite=true "
                "(--overwrite) to start over"
            )
        return {i for i in range(batches) if (parts / _part_name(i)).is_file()}
    if output.exists() and not overwrite:
        key = names.get("output_path", "output_path")
        raise ConfigError(
            f"{key}={output}: the file exists; give --overwrite (overwrite=true) to replace it, or another path"
        )
    return set()


def _start_parts(parts: Path, fingerprint: dict[str, Any], overwrite: bool) -> None:
    """The parts folder of this run: kept (resumed), emptied (overwrite) or made, with its fingerprint."""
    if overwrite and parts.exists():
        shutil.rmtree(parts)
    meta = parts / PARTS_META
    if not meta.is_file():
        parts.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(fingerprint, indent=1))


def _part_name(batch: int) -> str:
    return f"batch_{batch:06d}.parquet"


def _write_part(parts: Path, batch: int, rows: range, columns: dict[str, list[list[Any]]]) -> None:
    table = pa.table({"row": list(rows), **columns})
    tmp = parts / (_part_name(batch) + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, parts / _part_name(batch))  # a part is there whole or not at all


def _write_output(cfg: GenerateConfig, output: Path, parts: Path, batches: int, rows: int) -> None:
    """The input's columns (verl's `responses` and the extras replaced where the input has them) + ours."""
    done = pa.concat_tables(pq.read_table(parts / _part_name(i)) for i in range(batches))
    if done["row"].to_pylist() != list(range(rows)):
        raise RuntimeError(f"{parts}: the parts do not cover rows 0..{rows - 1} once each; delete the folder")
    path = Path(cfg.data_path)
    if path.suffix.lower() == ".parquet":
        table = pq.read_table(path)
    else:
        table = pa.Table.from_pylist(
            [json.loads(line) for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
        )
    added = (RESPONSES, *EXTRA_COLUMNS) if cfg.extra_columns else (RESPONSES,)
    table = table.drop_columns([c for c in added if c in table.column_names])
    for column in added:
        table = table.append_column(column, done[column])
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, output)

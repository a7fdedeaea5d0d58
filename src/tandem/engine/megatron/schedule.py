"""How `MegatronEngine` (engine.py) runs micro-batches: megatron's pipeline schedule over the model chunks, and
each micro-batch's GPTModel inputs (packed rows or padded ones, megatron's attention mask, the sequence- and
context-parallel shares of the columns).

`PipelineSchedule` is built once by the engine over explicit arguments (the layout, the model chunks, the settings
it needs) and reads nothing of the engine; tests/engine/test_host_contracts.py checks that it reads only what its
constructor sets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from tandem.batch import Batch
from tandem.data.packing import pack_model_inputs
from tandem.engine import moe, router_replay
from tandem.engine.base import ModelOutput, pad_micro_batch
from tandem.engine.megatron.experts import RouterBalance, RouterTape, router_rows
from tandem.engine.megatron.parallel import ParallelLayout
from tandem.engine.megatron.vocab_parallel import VocabParallel
from tandem.engine.micro import real_token_count


class PipelineSchedule:
    """Every micro-batch of a MegatronEngine through megatron's pipeline schedule (`run`), and each micro-batch's
    model inputs. Built once by the engine over what it names: no engine behind it.

    Args:
        layout: this rank's place in megatron's layout (parallel.py).
        models: the model chunks the schedule runs (DDP-wrapped when trainable).
        device: where the micro-batches go.
        pad_id: the token that pads rows and fills passes that add nothing.
        packing: pack each micro-batch's sequences into rows (data/packing.py).
        vocab_parallel: the logits' vocabulary split over the TP ranks (None: whole).
        router_balance: a mixture-of-experts model in training: its load-balancing term (experts.py), or None.
        routes: router replay's tape (experts.py, engine/router_replay.py), or None.
        row_rotaries: context parallel: each chunk's RowRotary (context_parallel.py).
        scope: the context the schedule runs in (the CPU adapter's mode; a no-op on CUDA).
        agree: the largest of a count over every rank (an expert group's ranks run as many passes).
    """

    def __init__(
        self,
        layout: ParallelLayout,
        models: list[nn.Module],
        device: torch.device,
        *,
        pad_id: int,
        packing: bool,
        vocab_parallel: VocabParallel | None,
        router_balance: RouterBalance | None,
        routes: RouterTape | None,
        row_rotaries: list[nn.Module],
        scope: Callable[[], AbstractContextManager[Any]],
        agree: Callable[[int], int],
    ) -> None:
        self.layout, self.models, self.device = layout, models, device
        self.pad_id, self.packing, self.vocab_parallel = pad_id, packing, vocab_parallel
        self.router_balance, self.routes, self.row_rotaries = router_balance, routes, row_rotaries
        self.scope, self.agree = scope, agree

    def run(
        self,
        micros: list[Batch],
        on_output: Any,
        *,
        forward_only: bool,
        step_tokens: float = 1.0,
        balance: bool = True,
        record: bool = False,
    ) -> list[Tensor] | None:
        """Every micro-batch through megatron's pipeline schedule; `on_output(output, micro)` on the last
        stage returns the micro-batch's loss (forward only: a zero). `step_tokens`: real tokens of the step
        over the data-parallel ranks (a MoE model's balance term weighs each micro-batch by its share);
        `balance`: add that term (False for a rank's dummy row). A micro-batch with `routed_experts` is routed
        to them; `record`: returns each micro-batch's routing [b, T, L, k], the same on every rank."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micros = [micro.to(self.device) for micro in micros]
        real_micros = list(micros)
        filler = None  # a pass that adds nothing, built only where a schedule needs one
        if self.layout.vp_size > 1 or self.layout.ep_size > 1:
            filler = pad_micro_batch(self.pad_id, self.device, tokens=self.layout.tp_size)
        if (
            self.layout.ep_size > 1
        ):  # the experts' all-to-all needs every rank of an expert group in every pass
            micros += [filler] * (self.agree(len(micros)) - len(micros))
        prepared = [self._model_inputs(micro) for micro in micros]
        if self.layout.vp_size > 1:
            # The interleaved schedule: one activation shape for every micro-batch (megatron's shape exchange
            # for variable lengths deadlocks there over gloo), and micro-batches in groups of pp, the last
            # group filled with passes that add nothing.
            shape = tuple(max(shape[i] for shape in self._whole_shapes(prepared)) for i in (0, 1))
            prepared = [self._model_inputs(micro, shape) for micro in micros]
            prepared += [self._model_inputs(filler, shape)] * (-len(prepared) % self.layout.pp_size)
        count = len(prepared)

        def step(data_iterator: Iterator, model: nn.Module) -> tuple[Tensor, Any]:
            micro, inputs, make_output, real = next(data_iterator)
            if self.routes is not None:
                self.routes.begin(id(micro), inputs["routes"][0], record and micro is not filler)
            columns_and_order = inputs.get("cp")
            if self.router_balance is not None:
                train = balance and not forward_only and micro is not filler
                tokens = (
                    router_rows(
                        real,
                        self.layout.tp_rank,
                        self.layout.tp_size,
                        self.layout.sequence_parallel,
                        columns_and_order[0] if columns_and_order is not None else None,
                    )
                    if train
                    else None
                )
                # DDP averages over data x context ranks (experts.py: the term's weight undoes it)
                self.router_balance.begin(
                    tokens, real_token_count(micro) / step_tokens, self.layout.dp_size * self.layout.cp_size
                )
            if columns_and_order is not None:  # the rotary embedding at this rank's columns
                for rotary in self.row_rotaries:
                    rotary.columns = columns_and_order[0]
            output_tensor = model(**{k: v for k, v in inputs.items() if k not in ("cp", "routes")})
            if self.routes is not None:
                self.routes.collect()

            def loss_func(logits: Tensor) -> tuple[Tensor, dict]:
                if (
                    self.layout.cp_group is not None
                ):  # this rank's columns -> whole rows, the same on the CP group
                    from tandem.engine.megatron.context_parallel import gather_columns

                    logits = gather_columns(logits, self.layout.cp_group, *columns_and_order)
                if micro is filler:  # a pass that adds nothing (an interleaved group's or an expert group's)
                    return logits.sum() * 0.0, {}
                # The schedule divides each micro-batch's loss by their count; the contract sums them.
                return on_output(make_output(logits), micro) * count, {}

            return output_tensor, loss_func

        widths = self._whole_shapes(prepared)
        with self.scope():
            get_forward_backward_func()(
                forward_step_func=step,
                # one iterator per model chunk: each chunk takes every micro-batch in turn
                data_iterator=[iter(prepared) for _ in self.models]
                if self.layout.vp_size > 1
                else iter(prepared),
                model=self.models,
                num_microbatches=count,
                seq_length=max(w[1] for w in widths),
                micro_batch_size=max(w[0] for w in widths),
                forward_only=forward_only,
            )
        if self.routes is None:
            return None
        try:
            if not record:
                return None
            by_micro = {id(micro): (*inputs["routes"][1], inputs.get("cp")) for micro, inputs, *_ in prepared}
            return [self._recorded_routing(id(micro), *by_micro[id(micro)]) for micro in real_micros]
        finally:
            self.routes.end()

    def _recorded_routing(
        self,
        key: int,
        packing: Any,
        grid: tuple[int, int],
        shape: tuple[int, int],
        real: Tensor | None,
        cp: tuple[Tensor, Tensor] | None,
    ) -> Tensor:
        """One micro-batch's recorded routing as [b, T, L, k]: this rank's router rows gathered over the TP
        ranks (sequence parallel), the CP ranks (context parallel: `cp`, this rank's columns and every rank's in
        gathered order) and the pipeline stages (each holds its own layers)."""
        width = grid[1] // self.layout.cp_size
        local_rows = grid[0] * width // (self.layout.tp_size if self.layout.sequence_parallel else 1)
        rows = self.routes.take(key, local_rows, self.device)
        if self.layout.sequence_parallel:
            parts = [torch.empty_like(rows) for _ in range(self.layout.tp_size)]
            dist.all_gather(parts, rows.contiguous(), group=self.layout.tp_group)
            rows = torch.cat(parts)
        placed = rows.view(width, grid[0], *rows.shape[1:]).transpose(0, 1)
        if cp is not None:  # every CP rank's columns, put back in column order
            parts = [torch.empty_like(placed) for _ in range(self.layout.cp_size)]
            dist.all_gather(parts, placed.contiguous(), group=self.layout.cp_group)
            gathered = torch.cat(parts, dim=1)
            order = cp[1].view(*cp[1].shape, 1, 1).expand_as(gathered)
            placed = torch.empty_like(gathered).scatter_(1, order, gathered)
        routed = router_replay.from_grid(placed, packing, shape, real).contiguous()
        if self.layout.pp_size > 1:
            dist.all_reduce(routed, op=dist.ReduceOp.MAX, group=self.layout.pp_group)
        return routed

    def _route_target(
        self, micro: Batch, packing: Any, grid: tuple[int, int], columns: Tensor | None
    ) -> Tensor | None:
        """The micro-batch's `routed_experts` in this rank's router rows [n, L, k], or None; `columns`: this CP
        rank's columns of each row (context parallel)."""
        if self.routes is None or router_replay.ROUTED_EXPERTS not in micro:
            return None
        placed = router_replay.to_grid(micro[router_replay.ROUTED_EXPERTS], packing, grid)
        if columns is not None:
            placed = placed.gather(1, columns.view(*columns.shape, 1, 1).expand(-1, -1, *placed.shape[2:]))
        placed = placed.transpose(0, 1)
        if self.layout.sequence_parallel:
            placed = placed.chunk(self.layout.tp_size, dim=0)[self.layout.tp_rank]
        return placed.reshape(-1, *placed.shape[2:])

    def _model_inputs(
        self, micro: Batch, shape: tuple[int, int] | None = None
    ) -> tuple[Batch, dict[str, Tensor], Any, Tensor]:
        """(micro, GPTModel keyword inputs, logits -> ModelOutput, [rows, columns] real tokens of the inputs)
        for one micro-batch.

        Packed: rows of several sequences with a block-diagonal causal mask. Padded: the batch as it is
        with a causal mask over its real tokens. megatron's mask is True where attention is NOT allowed.
        `shape`: (rows, columns) to pad the inputs to (the interleaved schedule's fixed shape); under sequence
        parallel the columns are padded to a multiple of TP. Padding is attended by nothing. Under context
        parallel every packed sequence (a padded row: the row) spans a multiple of 2 x CP (x TP) columns, and
        the inputs hold this rank's chunks of each (`_context_parallel_share`)."""
        ids = micro["input_ids"]
        padded_shape = tuple(ids.shape)
        # the columns are split over the TP ranks (sequence parallel), in 2 chunks per CP rank (context parallel)
        multiple = (self.layout.tp_size if self.layout.sequence_parallel else 1) * (
            2 * self.layout.cp_size if self.layout.cp_size > 1 else 1
        )
        if self.packing and "attention_mask" in micro:  # under CP every sequence splits alike: aligned
            inputs, packing = pack_model_inputs(ids, micro["attention_mask"], self.pad_id, align=multiple)
            segment = (inputs["position_ids"] == 0).long().cumsum(-1)
            allowed = segment[:, :, None] == segment[:, None, :]
            real = moe.real_tokens(None, inputs["input_ids"].shape, packing).view(inputs["input_ids"].shape)
        else:
            inputs, packing = {"input_ids": ids, "position_ids": micro["position_ids"]}, None
            real = (
                micro["attention_mask"].bool() if "attention_mask" in micro else torch.ones_like(ids).bool()
            )
            allowed = real[:, None, :].expand(-1, ids.shape[1], -1)
        rows, width = inputs["input_ids"].shape
        to_rows, to_width = shape or (rows, width)
        to_width = -(-to_width // multiple) * multiple
        extra_rows, extra = to_rows - rows, to_width - width
        if extra_rows or extra:
            inputs = {
                "input_ids": F.pad(inputs["input_ids"], (0, extra, 0, extra_rows), value=self.pad_id),
                "position_ids": F.pad(inputs["position_ids"], (0, extra, 0, extra_rows)),
            }
            allowed = F.pad(allowed, (0, extra, 0, extra, 0, extra_rows))
            real = F.pad(real, (0, extra, 0, extra_rows))
        causal = torch.ones(to_width, to_width, dtype=torch.bool, device=ids.device).tril()
        inputs["attention_mask"] = ~(allowed & causal).unsqueeze(1)
        if self.layout.cp_size > 1:
            inputs = self._context_parallel_share(inputs, real if packing is not None else None)
        # router replay: the target in the routers' rows, and what maps a record back to [b, T, L, k]
        grid = (to_rows, to_width)
        mask = micro.get("attention_mask")
        columns = inputs["cp"][0] if "cp" in inputs else None
        inputs["routes"] = (
            self._route_target(micro, packing, grid, columns),
            (packing, grid, padded_shape, mask),
        )

        def make_output(logits: Tensor) -> ModelOutput:
            return ModelOutput(
                logits[:rows, :width], padded_shape, packing, vocab_parallel=self.vocab_parallel
            )

        return micro, inputs, make_output, real

    def _context_parallel_share(
        self, inputs: dict[str, Tensor], packed_real: Tensor | None
    ) -> dict[str, Tensor]:
        """This CP rank's columns of the whole-row inputs (context_parallel.py): its chunks of each sequence
        (`packed_real` [rows, columns]: a packed batch's real tokens, each sequence starting at position 0;
        None: one sequence per row), the mask of its rows against every rank's columns in gathered order, and
        under `cp` the columns (for RowRotary and the output gather)."""
        from tandem.engine.megatron.context_parallel import sequence_columns  # imports megatron

        ids = inputs["input_ids"]
        starts = torch.zeros_like(ids, dtype=torch.bool)
        if packed_real is not None:
            starts = (inputs["position_ids"] == 0) & packed_real
        every = [sequence_columns(starts, rank, self.layout.cp_size) for rank in range(self.layout.cp_size)]
        columns, order = every[self.layout.cp_rank], torch.cat(every, dim=1)
        mask = inputs["attention_mask"]
        rows = mask.gather(2, columns[:, None, :, None].expand(-1, 1, -1, mask.shape[-1]))
        return {
            "input_ids": ids.gather(1, columns),
            "position_ids": inputs["position_ids"].gather(1, columns),
            "attention_mask": rows.gather(3, order[:, None, None, :].expand(-1, 1, columns.shape[1], -1)),
            "cp": (columns, order),
        }

    @staticmethod
    def _whole_shapes(prepared: list[tuple]) -> list[tuple[int, int]]:
        """(rows, columns) of each prepared micro-batch's whole rows (its mask's: a CP rank's inputs hold a
        share of the columns)."""
        return [
            (inputs["input_ids"].shape[0], inputs["attention_mask"].shape[-1]) for _, inputs, *_ in prepared
        ]

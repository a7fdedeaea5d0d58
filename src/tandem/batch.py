"""`Batch`: the one object that travels between the controller and the workers.

A Batch holds N samples as
- `tensors`: a TensorDict of batch size [N] (token ids, masks, log-probs, values, ...),
- `non_tensors`: per-sample Python objects as 1-D numpy object arrays of length N
  (raw prompts, ground truth, data source, group ids), and
- `meta`: a dict for the whole batch (temperature, step, ...).

Every row operation (slice, reorder, repeat, split, concat) acts on tensors and
non-tensors together, so row i always describes the same sample.

Transport: pickling turns every tensor into one flat numpy byte buffer, which Ray and
pickle protocol 5 send out-of-band (no per-element pickling, no copy into the pickle
stream). Tensors arrive on the CPU; the receiver moves them with `to(device)`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

# the tensors a rollout adds to a Batch, one row per sample (rollout/base.py assembles them); verl's DataProto
# carries the same tensors under the same names
ROLLOUT_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "rollout_log_probs",
)

IndexLike = slice | Sequence[int] | np.ndarray | torch.Tensor


class BatchError(ValueError):
    """A Batch operation got inputs that do not fit together (sizes, keys, values)."""


def _object_array(values: Any, key: str) -> np.ndarray:
    """A 1-D numpy object array of per-sample values (lists stay lists, not a 2-D array)."""
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    if isinstance(values, np.ndarray | torch.Tensor) and values.ndim != 1:
        raise BatchError(
            f"non-tensor '{key}' must be 1-D (one object per sample), got shape {tuple(values.shape)}"
        )
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise BatchError(
            f"non-tensor '{key}' must be a sequence with one value per sample, got {type(values).__name__}"
        )
    values = list(values)
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _same_objects(a: np.ndarray, b: np.ndarray) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x is y:
            continue
        try:
            eq = x == y
            if isinstance(eq, np.ndarray | torch.Tensor):
                eq = bool(eq.all()) and np.shape(x) == np.shape(y)
            if not eq:
                return False
        except Exception:
            return False
    return True


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


def _as_index(index: IndexLike, n: int) -> torch.Tensor | slice:
    if isinstance(index, slice):
        return index
    idx = torch.as_tensor(np.asarray(index) if not isinstance(index, torch.Tensor) else index)
    if idx.dtype == torch.bool:
        if idx.numel() != n:
            raise BatchError(f"boolean row mask has {idx.numel()} entries for a batch of {n}")
        return idx.nonzero().flatten()
    if idx.numel() == 0:
        return idx.long().flatten()
    if idx.is_floating_point():
        raise BatchError(f"row indices must be integers, got {idx.dtype}")
    idx = idx.long().flatten()
    if int(idx.max()) >= n or int(idx.min()) < -n:
        raise BatchError(
            f"row index out of range for a batch of {n}: min {int(idx.min())}, max {int(idx.max())}"
        )
    return idx


class Batch:
    """N samples: `tensors` (TensorDict [N]), `non_tensors` (object arrays [N]), `meta` (dict)."""

    def __init__(
        self,
        tensors: TensorDict | Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        *,
        batch_size: int | None = None,
    ) -> None:
        tensors = dict(tensors.items()) if tensors is not None else {}
        non_tensors = {k: _object_array(v, k) for k, v in (non_tensors or {}).items()}
        sizes = {f"tensor '{k}'": int(v.shape[0]) if v.dim() > 0 else -1 for k, v in tensors.items()}
        sizes.update({f"non-tensor '{k}'": len(v) for k, v in non_tensors.items()})
        for what, size in sizes.items():
            if size < 0:
                raise BatchError(
                    f"{what} is a 0-d tensor; every tensor needs the batch as its first dimension"
                )
        if batch_size is None:
            batch_size = next(iter(sizes.values()), 0)
        wrong = {what: size for what, size in sizes.items() if size != batch_size}
        if wrong:
            listing = ", ".join(f"{w} has {s}" for w, s in sizes.items())
            raise BatchError(f"mismatched batch sizes: expected {batch_size} rows; {listing}")
        for k, v in tensors.items():
            if not isinstance(v, torch.Tensor):
                raise BatchError(f"tensor '{k}' is a {type(v).__name__}; put Python objects in non_tensors")
        both = set(tensors) & set(non_tensors)
        if both:
            raise BatchError(f"key(s) {sorted(both)} given both as tensor and as non-tensor")
        self.tensors = TensorDict(tensors, batch_size=[batch_size])
        self.non_tensors: dict[str, np.ndarray] = non_tensors
        self.meta: dict[str, Any] = dict(meta or {})
        self._size = batch_size

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Batch:
        return cls(tensors, non_tensors, meta)

    # ---------------------------------------------------------------- access
    def __len__(self) -> int:
        return self._size

    def keys(self) -> list[str]:
        return [*self.tensors.keys(), *self.non_tensors]

    def __contains__(self, key: object) -> bool:
        return key in self.non_tensors or (isinstance(key, str) and key in self.tensors.keys())

    def get(self, key: str, default: Any = None) -> Any:
        """The column `key` (tensor or per-sample objects), or `default` when there is none."""
        if key in self:
            return self[key]
        return default

    def _missing(self, key: str, op: str) -> KeyError:
        return KeyError(f"Batch.{op}: no key '{key}'; the batch has {sorted(self.keys())}")

    def __getitem__(self, key: str | int | IndexLike) -> Any:
        if isinstance(key, str):
            if key in self.non_tensors:
                return self.non_tensors[key]
            if key in self.tensors.keys():
                return self.tensors[key]
            raise self._missing(key, "__getitem__")
        if isinstance(key, int | np.integer):
            i = int(key)
            if not -self._size <= i < self._size:
                raise IndexError(f"row {i} out of range for a batch of {self._size}")
            row = {k: v[i] for k, v in self.tensors.items()}
            row.update({k: v[i] for k, v in self.non_tensors.items()})
            return row
        return self._take(_as_index(key, self._size))

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.shape[0] != self._size:
                raise BatchError(
                    f"tensor '{key}' has shape {tuple(value.shape)}; the batch has {self._size} rows"
                )
            self.non_tensors.pop(key, None)
            self.tensors[key] = value
        else:
            arr = _object_array(value, key)
            if len(arr) != self._size:
                raise BatchError(f"non-tensor '{key}' has {len(arr)} values; the batch has {self._size} rows")
            if key in self.tensors.keys():
                del self.tensors[key]
            self.non_tensors[key] = arr

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self._size):
            yield self[i]

    def __repr__(self) -> str:
        parts = [
            f"{k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}" for k, v in self.tensors.items()
        ]
        parts += [f"{k}: object" for k in self.non_tensors]
        return f"Batch(n={self._size}, {{{', '.join(parts)}}}, meta={sorted(self.meta)})"

    # ---------------------------------------------------------------- keys
    def _check_keys(self, keys: Iterable[str], op: str) -> list[str]:
        keys = list(keys)
        for k in keys:
            if k not in self:
                raise self._missing(k, op)
        return keys

    def select(self, *keys: str, meta: bool = True) -> Batch:
        """A batch with only `keys` (tensors are shared, not copied)."""
        keys = self._check_keys(keys, "select")
        tensors = {k: self.tensors[k] for k in keys if k in self.tensors.keys()}
        non_tensors = {k: self.non_tensors[k] for k in keys if k in self.non_tensors}
        return Batch(tensors, non_tensors, self.meta if meta else None, batch_size=self._size)

    def pop(self, *keys: str) -> Batch:
        """Remove `keys` from this batch and return them as a batch of their own."""
        self._check_keys(keys, "pop")
        out = self.select(*keys)
        for k in keys:
            if k in self.non_tensors:
                del self.non_tensors[k]
            else:
                del self.tensors[k]
        return out

    def exclude(self, *keys: str) -> Batch:
        """A batch without `keys`."""
        self._check_keys(keys, "exclude")
        return self.select(*[k for k in self.keys() if k not in keys])

    def union(self, other: Batch) -> Batch:
        """Both batches' keys in one; a key in both must hold equal values (else BatchError)."""
        if len(other) != self._size:
            raise BatchError(f"union of batches with {self._size} and {len(other)} rows")
        tensors = dict(self.tensors.items())
        for k, v in other.tensors.items():
            if k in tensors and not (tensors[k] is v or torch.equal(tensors[k], v)):
                raise BatchError(f"union: tensor '{k}' differs between the two batches")
            tensors[k] = v
        non_tensors = dict(self.non_tensors)
        for k, v in other.non_tensors.items():
            if k in non_tensors and not _same_objects(non_tensors[k], v):
                raise BatchError(f"union: non-tensor '{k}' differs between the two batches")
            non_tensors[k] = v
        meta = dict(self.meta)
        for k, v in other.meta.items():
            if k in meta and not _same_value(meta[k], v):
                raise BatchError(f"union: meta '{k}' differs between the two batches ({meta[k]!r} vs {v!r})")
            meta[k] = v
        return Batch(tensors, non_tensors, meta, batch_size=self._size)

    # ---------------------------------------------------------------- rows
    def _take(self, index: torch.Tensor | slice) -> Batch:
        tensors = self.tensors[index]
        np_index = index if isinstance(index, slice) else index.numpy()
        non_tensors = {k: v[np_index] for k, v in self.non_tensors.items()}
        return Batch(tensors, non_tensors, self.meta, batch_size=int(tensors.batch_size[0]))

    def slice(self, start: int | None = None, stop: int | None = None, step: int | None = None) -> Batch:
        return self._take(slice(start, stop, step))

    def reorder(self, indices: IndexLike) -> Batch:
        """Rows in the order `indices` (a permutation, or any selection of rows)."""
        return self._take(_as_index(indices, self._size))

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row n times; interleaved keeps one prompt's n samples adjacent (a a b b), else (a b a b)."""
        if n < 1:
            raise BatchError(f"repeat needs n >= 1, got {n}")
        base = torch.arange(self._size)
        index = base.repeat_interleave(n) if interleave else base.repeat(n)
        return self._take(index)

    @classmethod
    def concat(cls, batches: Sequence[Batch], meta: str = "strict") -> Batch:
        """Rows of all batches in order. Keys must match; meta must agree unless meta='first'."""
        batches = list(batches)
        if not batches:
            raise BatchError("concat of an empty list of batches")
        first = batches[0]
        keys = set(first.keys())
        for i, b in enumerate(batches[1:], start=1):
            if set(b.keys()) != keys:
                missing = sorted(keys - set(b.keys()))
                extra = sorted(set(b.keys()) - keys)
                raise BatchError(
                    f"concat: batch {i} differs in keys from batch 0 (missing {missing}, extra {extra})"
                )
        merged_meta = dict(first.meta)
        for i, b in enumerate(batches[1:], start=1):
            for k, v in b.meta.items():
                if k not in merged_meta:
                    merged_meta[k] = v
                elif meta == "strict" and not _same_value(merged_meta[k], v):
                    raise BatchError(
                        f"concat: meta '{k}' differs between batch 0 and batch {i}; "
                        "pass meta='first' to keep batch 0's value"
                    )
        tensors = {}
        for k in first.tensors.keys():
            parts = [b.tensors[k] for b in batches]
            trailing = {tuple(p.shape[1:]) for p in parts}
            if len(trailing) > 1:
                raise BatchError(
                    f"concat: tensor '{k}' has different trailing shapes {sorted(trailing)}; pad first"
                )
            tensors[k] = torch.cat(parts)
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors}
        return cls(tensors, non_tensors, merged_meta, batch_size=sum(len(b) for b in batches))

    def split(self, sizes: int | Sequence[int]) -> list[Batch]:
        """Contiguous parts: an int gives parts of that size (the last may be smaller), a list exact sizes."""
        if isinstance(sizes, int):
            if sizes < 1:
                raise BatchError(f"split size must be >= 1, got {sizes}")
            sizes = [min(sizes, self._size - s) for s in range(0, self._size, sizes)]
        sizes = list(sizes)
        if sum(sizes) != self._size or any(s < 0 for s in sizes):
            raise BatchError(f"split sizes {sizes} do not add up to the batch's {self._size} rows")
        out, start = [], 0
        for s in sizes:
            out.append(self.slice(start, start + s))
            start += s
        return out

    def chunk(self, k: int) -> list[Batch]:
        """k contiguous parts whose sizes differ by at most one (larger first); uneven is fine."""
        return self.split(even_sizes(self._size, k))

    def partition(self, groups: Sequence[Sequence[int]]) -> tuple[list[Batch], Partition]:
        """Parts made of the given row indices (each row exactly once); `Partition.merge` undoes it."""
        plan = Partition.from_groups(groups, self._size)
        return [self._take(torch.as_tensor(list(g), dtype=torch.long)) for g in plan.groups], plan

    def chunk_with_plan(self, k: int) -> tuple[list[Batch], Partition]:
        """`chunk(k)` plus the plan that merges the k outputs back (for data-parallel dispatch)."""
        bounds = np.cumsum([0, *even_sizes(self._size, k)])
        return self.partition([range(int(a), int(b)) for a, b in itertools.pairwise(bounds)])

    def pad_to_multiple(self, k: int) -> tuple[Batch, int]:
        """Append copies of the first rows until len is a multiple of k; returns (batch, pad_size)."""
        if k < 1:
            raise BatchError(f"pad_to_multiple needs k >= 1, got {k}")
        if self._size == 0:
            raise BatchError("cannot pad an empty batch: there is no row to copy")
        pad = (-self._size) % k
        if pad == 0:
            return self, 0
        index = torch.cat([torch.arange(self._size), torch.arange(pad) % self._size])
        return self._take(index), pad

    def unpad(self, pad_size: int) -> Batch:
        """Drop the last `pad_size` rows added by `pad_to_multiple`."""
        if not 0 <= pad_size <= self._size:
            raise BatchError(f"unpad({pad_size}) on a batch of {self._size} rows")
        return self if pad_size == 0 else self.slice(0, self._size - pad_size)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.tensors.to(device, non_blocking=non_blocking),
            self.non_tensors,
            self.meta,
            batch_size=self._size,
        )

    # ---------------------------------------------------------------- transport
    def __getstate__(self) -> dict[str, Any]:
        packed = {}
        for k, t in self.tensors.items():
            flat = t.detach().to("cpu").contiguous().reshape(-1)
            packed[k] = (flat.view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape))
        return {"tensors": packed, "non_tensors": self.non_tensors, "meta": self.meta, "size": self._size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        tensors = {}
        for k, (raw, dtype, shape) in state["tensors"].items():
            if raw.size == 0:  # numpy copies an empty buffer with stride 0, which torch cannot .view()
                tensors[k] = torch.empty(shape, dtype=getattr(torch, dtype))
                continue
            if not raw.flags.writeable:  # Ray's object store hands out read-only views
                raw = raw.copy()
            tensors[k] = torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)
        restored = Batch(tensors, state["non_tensors"], state["meta"], batch_size=state["size"])
        self.__dict__.update(restored.__dict__)


def even_sizes(n: int, k: int) -> list[int]:
    """n split into k parts differing by at most one, larger parts first: (7, 3) -> [3, 2, 2]."""
    if k < 1:
        raise BatchError(f"cannot split into {k} parts")
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


@dataclass(frozen=True)
class Partition:
    """How a batch was cut into parts, so the parts' outputs can be put back in the original order."""

    groups: tuple[tuple[int, ...], ...]
    size: int

    @classmethod
    def from_groups(cls, groups: Sequence[Sequence[int]], size: int) -> Partition:
        groups = tuple(tuple(int(i) for i in g) for g in groups)
        seen = sorted(i for g in groups for i in g)
        if seen != list(range(size)):
            dupes = sorted({i for i in seen if seen.count(i) > 1})
            missing = sorted(set(range(size)) - set(seen))
            raise BatchError(
                f"a partition must use each of the {size} rows exactly once (duplicated {dupes[:10]}, missing {missing[:10]})"
            )
        return cls(groups, size)

    @property
    def sizes(self) -> list[int]:
        return [len(g) for g in self.groups]

    def merge(self, parts: Sequence[Batch], meta: str = "strict") -> Batch:
        """Concatenate per-part outputs and restore the original row order.

        A part may return k rows per input row (k the same for every part, e.g. k samples per prompt):
        row i's k outputs stay together, in place of row i.
        """
        if len(parts) != len(self.groups):
            raise BatchError(f"merge got {len(parts)} parts for a partition into {len(self.groups)}")
        ratios = {len(p) // len(g) for p, g in zip(parts, self.groups, strict=True) if len(g)}
        k = ratios.pop() if len(ratios) == 1 else 1
        for i, (p, g) in enumerate(zip(parts, self.groups, strict=True)):
            if len(p) != len(g) * k or k < 1:
                listing = ", ".join(
                    f"part {j}: {len(q)} rows for {len(h)}"
                    for j, (q, h) in enumerate(zip(parts, self.groups))
                )
                raise BatchError(
                    f"merge: part {i} has {len(p)} rows, the partition gave it {len(g)}; every part must "
                    f"return the same whole number of rows per row it got ({listing})"
                )
        merged = Batch.concat(parts, meta=meta)
        order = torch.as_tensor(
            [i * k + j for g in self.groups for i in g for j in range(k)], dtype=torch.long
        )
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        return merged.reorder(inverse)

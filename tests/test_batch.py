import pickle

import numpy as np
import pytest
import torch

from tandem.batch import Batch, BatchError, Partition, even_sizes


def make(n: int = 5) -> Batch:
    return Batch.from_dict(
        {
            "input_ids": torch.arange(n * 3).view(n, 3),
            "score": torch.arange(n, dtype=torch.float32) / 10,
        },
        {
            "uid": [f"p{i}" for i in range(n)],
            "raw_prompt": [[{"role": "user", "content": str(i)}] for i in range(n)],
        },
        {"temperature": 1.0},
    )


def rows(b: Batch) -> list[int]:
    """The original row numbers, read back from input_ids."""
    return (b["input_ids"][:, 0] // 3).tolist()


def test_construction_and_access():
    b = make()
    assert len(b) == 5
    assert b["uid"].dtype == object and b["uid"][2] == "p2"
    # a per-sample list stays a list: the object array is 1-D, not [5, 1]
    assert b["raw_prompt"].shape == (5,)
    assert b["raw_prompt"][3] == [{"role": "user", "content": "3"}]
    assert set(b.keys()) == {"input_ids", "score", "uid", "raw_prompt"}
    assert "uid" in b and "nope" not in b
    row = b[1]
    assert row["uid"] == "p1" and row["input_ids"].tolist() == [3, 4, 5]


def test_mismatched_sizes_name_the_key():
    with pytest.raises(BatchError, match="tensor 'b' has 3"):
        Batch.from_dict({"a": torch.zeros(4), "b": torch.zeros(3)})
    with pytest.raises(BatchError, match="non-tensor 'uid' has 2"):
        Batch.from_dict({"a": torch.zeros(4)}, {"uid": ["x", "y"]})
    b = make()
    with pytest.raises(BatchError, match="'extra' has shape"):
        b["extra"] = torch.zeros(4)
    with pytest.raises(BatchError, match="one value per sample"):
        Batch.from_dict({"a": torch.zeros(1)}, {"uid": "abc"})


def test_missing_key_names_it_and_lists_keys():
    b = make()
    with pytest.raises(KeyError, match="no key 'responses'.*input_ids"):
        b["responses"]
    with pytest.raises(KeyError, match="Batch.select: no key 'values'"):
        b.select("input_ids", "values")
    with pytest.raises(KeyError, match="Batch.pop: no key 'x'"):
        b.pop("x")


def test_select_pop_exclude():
    b = make()
    s = b.select("score", "uid")
    assert set(s.keys()) == {"score", "uid"} and s.meta == {"temperature": 1.0}
    assert s["score"] is b["score"]  # shared, not copied
    popped = b.pop("score")
    assert set(popped.keys()) == {"score"} and "score" not in b
    assert set(b.exclude("uid").keys()) == {"input_ids", "raw_prompt"}


def test_union_merges_and_rejects_conflicts():
    b = make()
    other = Batch.from_dict(
        {"values": torch.ones(5), "score": b["score"].clone()}, {"uid": list(b["uid"])}, {"step": 3}
    )
    u = b.union(other)
    assert set(u.keys()) == {"input_ids", "score", "uid", "raw_prompt", "values"}
    assert u.meta == {"temperature": 1.0, "step": 3}
    bad = Batch.from_dict({"score": b["score"] + 1})
    with pytest.raises(BatchError, match="tensor 'score' differs"):
        b.union(bad)
    with pytest.raises(BatchError, match="non-tensor 'uid' differs"):
        b.union(Batch.from_dict(None, {"uid": ["z"] * 5}))
    with pytest.raises(BatchError, match="meta 'temperature' differs"):
        b.union(Batch.from_dict({"x": torch.zeros(5)}, meta={"temperature": 0.5}))
    with pytest.raises(BatchError, match="5 and 4 rows"):
        b.union(make(4))


def test_concat_and_split_round_trip_uneven():
    b = make(7)
    parts = b.split([3, 0, 4])
    assert [len(p) for p in parts] == [3, 0, 4]
    assert rows(parts[2]) == [3, 4, 5, 6]
    assert list(parts[2]["uid"]) == ["p3", "p4", "p5", "p6"]
    back = Batch.concat(parts)
    assert torch.equal(back["input_ids"], b["input_ids"]) and list(back["uid"]) == list(b["uid"])
    assert [len(p) for p in b.split(3)] == [3, 3, 1]
    assert [len(p) for p in b.chunk(3)] == [3, 2, 2]
    assert [len(p) for p in b.chunk(9)] == [1] * 7 + [0, 0]
    with pytest.raises(BatchError, match="do not add up"):
        b.split([3, 3])


def test_concat_errors():
    a, b = make(2), make(3)
    with pytest.raises(BatchError, match=r"batch 1 differs in keys.*missing \['score'\]"):
        Batch.concat([a, b.exclude("score")])
    c = make(3)
    c.meta["temperature"] = 0.0
    with pytest.raises(BatchError, match="meta 'temperature' differs"):
        Batch.concat([a, c])
    assert Batch.concat([a, c], meta="first").meta["temperature"] == 1.0
    wide = Batch.from_dict(
        {"input_ids": torch.zeros(2, 4, dtype=torch.long), "score": torch.zeros(2)},
        {"uid": ["a", "b"], "raw_prompt": [1, 2]},
    )
    with pytest.raises(BatchError, match="'input_ids' has different trailing shapes"):
        Batch.concat([a, wide])


def test_repeat_interleaved_and_tiled():
    b = make(3)
    r = b.repeat(2)
    assert rows(r) == [0, 0, 1, 1, 2, 2]
    assert list(r["uid"]) == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert rows(b.repeat(2, interleave=False)) == [0, 1, 2, 0, 1, 2]


def test_reorder_slice_and_masks():
    b = make(5)
    r = b.reorder([4, 0, 2])
    assert rows(r) == [4, 0, 2] and list(r["uid"]) == ["p4", "p0", "p2"]
    assert rows(b[torch.tensor([True, False, True, False, False])]) == [0, 2]
    assert rows(b.slice(1, 4)) == [1, 2, 3]
    assert rows(b[::2]) == [0, 2, 4]
    with pytest.raises(BatchError, match="out of range"):
        b.reorder([5])


def test_partition_merge_restores_order():
    b = make(6)
    parts, plan = b.partition([[5, 1], [0, 3, 4], [2]])
    assert [rows(p) for p in parts] == [[5, 1], [0, 3, 4], [2]]
    # each worker adds an output; merge puts rows back where they were
    outs = [p.select("input_ids").union(Batch.from_dict({"out": p["score"] * 2})) for p in parts]
    merged = plan.merge(outs)
    assert rows(merged) == list(range(6))
    assert torch.allclose(merged["out"], b["score"] * 2)
    with pytest.raises(BatchError, match="exactly once"):
        Partition.from_groups([[0, 1], [1]], 3)
    with pytest.raises(BatchError, match="part 0 has 1 rows"):
        plan.merge([outs[0][:1], outs[1], outs[2]])


def test_merge_keeps_each_rows_k_outputs_together():
    """A worker may return k rows per row it got (n samples per prompt): they stay in the row's place."""
    b = make(5)
    parts, plan = b.chunk_with_plan(3)  # rows [0, 1], [2, 3], [4]
    merged = plan.merge([p.repeat(3) for p in parts])
    assert rows(merged) == [i for i in range(5) for _ in range(3)]
    _, empty_plan = make(1).chunk_with_plan(2)  # a 0-row part says nothing about k
    assert rows(empty_plan.merge([make(1).repeat(2), make(1)[:0]])) == [0, 0]
    with pytest.raises(BatchError, match="same whole number of rows"):
        plan.merge([parts[0].repeat(2), parts[1].repeat(3), parts[2].repeat(3)])


def test_chunk_with_plan_uneven():
    b = make(7)
    parts, plan = b.chunk_with_plan(3)
    assert plan.sizes == [3, 2, 2]
    assert rows(plan.merge(parts)) == list(range(7))


def test_pad_and_unpad():
    b = make(5)
    p, pad = b.pad_to_multiple(4)
    assert pad == 3 and len(p) == 8
    assert rows(p) == [0, 1, 2, 3, 4, 0, 1, 2]
    assert rows(p.unpad(pad)) == rows(b)
    same, pad0 = b.pad_to_multiple(5)
    assert pad0 == 0 and same is b
    p2, pad2 = make(2).pad_to_multiple(5)
    assert pad2 == 3 and rows(p2) == [0, 1, 0, 1, 0]


def test_even_sizes():
    assert even_sizes(7, 3) == [3, 2, 2]
    assert even_sizes(0, 2) == [0, 0]
    with pytest.raises(BatchError):
        even_sizes(3, 0)


def test_to_device_keeps_non_tensors():
    b = make().to("cpu")
    assert b["uid"][0] == "p0" and b["input_ids"].device.type == "cpu"


def test_pickle_sends_tensors_out_of_band():
    b = make(4)
    b["bf16"] = torch.randn(4, 3).to(torch.bfloat16)
    b["view"] = torch.randn(4, 6)[:, ::2]  # non-contiguous
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    # one out-of-band buffer per tensor, none of them in the pickle stream
    assert len(buffers) == len(b.tensors.keys()) == 4
    assert sum(memoryview(x).nbytes for x in buffers) == sum(
        t.numel() * t.element_size() for t in b.tensors.values()
    )
    back = pickle.loads(payload, buffers=buffers)
    for k in b.tensors.keys():
        assert back[k].dtype == b[k].dtype and torch.equal(back[k], b[k]), k
    assert list(back["uid"]) == list(b["uid"]) and back.meta == b.meta


def test_pickle_large_tensor_is_not_in_band():
    b = Batch.from_dict({"x": torch.zeros(64, 1024)})
    payload = pickle.dumps(b, protocol=5, buffer_callback=lambda _: None)
    assert len(payload) < 2048  # 256 KiB of data, a few hundred bytes of pickle


@pytest.mark.slow
def test_ray_round_trip(ray_local):
    ray = ray_local

    @ray.remote
    def double_scores(batch: Batch) -> Batch:
        batch["score"] = batch["score"] * 2  # the received tensor is writable
        batch["log_probs"] = torch.full((len(batch), 2), -1.0)
        return batch.select("score", "log_probs", "uid")

    b = make(6)
    out = ray.get(double_scores.remote(b))
    assert torch.allclose(out["score"], b["score"] * 2)
    assert out["log_probs"].shape == (6, 2) and list(out["uid"]) == list(b["uid"])
    assert torch.equal(b.union(out.exclude("score"))["input_ids"], b["input_ids"])


def test_numpy_object_input_is_kept():
    arr = np.array(["a", "b"], dtype=object)
    b = Batch.from_dict({"x": torch.zeros(2)}, {"s": arr})
    assert b["s"] is arr


@pytest.mark.slow
def test_split_across_ray_actors_and_merge_back(ray_local):
    """The data-parallel pattern: uneven chunks to 2 actors, outputs merged in the original order."""
    ray = ray_local

    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self, rank: int) -> None:
            self.rank = rank

        def score(self, batch: Batch) -> Batch:
            rank = torch.full((len(batch),), self.rank)
            return Batch.from_dict({"doubled": batch["score"] * 2, "rank": rank}, {"uid": batch["uid"]})

    workers = [Worker.remote(r) for r in range(2)]
    b = make(5)
    parts, plan = b.chunk_with_plan(2)
    merged = plan.merge(ray.get([w.score.remote(p) for w, p in zip(workers, parts)]))
    assert torch.allclose(merged["doubled"], b["score"] * 2)
    assert merged["rank"].tolist() == [0, 0, 0, 1, 1]
    assert list(merged["uid"]) == list(b["uid"])

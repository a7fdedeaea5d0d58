"""A megatron distributed checkpoint as the starting weights (engine/megatron/dist_start.py; verl's
use_dist_checkpointing / dist_checkpointing_path) and `tandem convert` both ways (dist_convert.py).

One gloo rank in this process (the `one_rank` fixture) converts the tiny model once; the engines built from the
checkpoint are compared with those built from the Hugging Face folder: the same weights and log-probs, bit for
bit (the conversion and the load copy float32 tensors). Two spawned ranks at TP=2 load the same one-rank
checkpoint (megatron reshards on load) and give the log-probs of TP=2 started from the folder.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from roles.roles_helpers import rollout_rows  # tests/ is on sys.path (pytest's rootdir)
from tandem.engine import EngineSpec
from tandem.models.tiny import save_tiny
from tandem.roles.common import MODEL_INPUTS, response_log_probs

from .ranks import start_ranks

pytest.importorskip("megatron.core")

from tandem.engine.megatron.dist_convert import hf_to_mcore, mcore_to_hf
from tandem.engine.megatron.engine import MegatronEngine

LENGTHS = [(5, 7), (2, 3), (4, 1), (3, 7)]


def _engine(
    model: Path, head: str = "lm", start: Path | None = None, tp: int = 1, optim=None
) -> MegatronEngine:
    from tandem.config.schema import MegatronConfig

    spec = EngineSpec(
        model_path=model,
        head=head,
        device="cpu",
        strategy="megatron",
        megatron=MegatronConfig(tensor_parallel=tp),
        dist_checkpoint=start,
        optim=optim,
    )
    return MegatronEngine(spec)


def _log_probs(engine: MegatronEngine) -> torch.Tensor:
    batch = rollout_rows(LENGTHS, 5, 7, seed=1)

    def fn(output, micro):
        return {"lp": response_log_probs(output, micro["responses"], 1.0, with_entropy=False)[0]}

    return engine.forward(batch.select(*MODEL_INPUTS, "responses"), fn, 2)["lp"]


def _weights(engine: MegatronEngine) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in engine.state_dict_iter()}


@pytest.fixture(scope="module")
def converted(one_rank, tmp_path_factory):
    """(the tiny model's folder, its weights as a megatron distributed checkpoint, the engine from the folder)."""
    out = tmp_path_factory.mktemp("dist") / "mcore"
    hf_to_mcore(one_rank, out)
    return one_rank, out, _engine(one_rank)


def test_the_checkpoint_is_megatron_s_with_its_stacked_layer_keys(converted):
    from megatron.core import dist_checkpointing

    _, ckpt, _ = converted
    shapes = {
        k: tuple(t.global_shape) for k, t in dist_checkpointing.load_tensors_metadata(str(ckpt)).items()
    }
    # the tiny Qwen2: 4 layers, hidden 256, 4 heads of 64 + 2 kv heads (q 256 + k 128 + v 128 = 512), tied head
    assert shapes["embedding.word_embeddings.weight"] == (320, 256)
    assert shapes["decoder.layers.self_attention.linear_qkv.weight"] == (4, 512, 256)
    assert shapes["decoder.layers.self_attention.linear_qkv.layer_norm_weight"] == (4, 256)  # TE's name
    assert shapes["decoder.final_layernorm.weight"] == (256,)
    assert "output_layer.weight" not in shapes


def test_an_engine_started_from_the_checkpoint_equals_one_started_from_the_folder(converted):
    model, ckpt, from_hf = converted
    started = _engine(model, start=ckpt)
    expected, actual = _weights(from_hf), _weights(started)
    assert actual.keys() == expected.keys()
    assert all(torch.equal(actual[k], expected[k]) for k in expected)
    assert torch.equal(_log_probs(started), _log_probs(from_hf))


def test_a_critic_drops_the_lm_checkpoint_s_output_and_starts_its_head_as_from_the_folder(
    converted, tmp_path
):
    model, ckpt, _ = converted
    from_hf, started = _engine(model, "value"), _engine(model, "value", ckpt)
    expected, actual = _weights(from_hf), _weights(started)
    assert "score.weight" in actual and all(torch.equal(actual[k], expected[k]) for k in expected)
    # a critic's own checkpoint (value head [1, 256]) starts the next critic with that head
    with torch.no_grad():
        started.chunks[0].output_layer.weight.add_(1.0)
    started.save_weights(tmp_path / "critic")
    again = _weights(_engine(model, "value", tmp_path / "critic"))
    assert torch.equal(again["score.weight"], expected["score.weight"] + 1.0)


def test_a_tandem_checkpoint_with_optimizer_state_is_a_starting_point_too(converted, tmp_path):
    from tandem.config.schema import OptimConfig

    model, _, from_hf = converted
    trained = _engine(model, optim=OptimConfig(lr=1e-3))
    trained.save(
        tmp_path / "actor"
    )  # the actor/ folder of a Tandem checkpoint: weights + optimizer + counters
    started = _engine(model, start=tmp_path / "actor")
    assert torch.equal(_log_probs(started), _log_probs(from_hf))


def test_mcore_to_hf_gives_back_the_folder_s_tensors(converted, tmp_path):
    model, ckpt, _ = converted
    out = mcore_to_hf(ckpt, model, tmp_path / "hf")
    original, back = load_file(model / "model.safetensors"), load_file(out / "model.safetensors")
    assert back.keys() == original.keys()
    assert all(torch.equal(back[k], original[k]) for k in original)
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= {p.name for p in out.iterdir()}


def test_a_missing_or_foreign_folder_is_named(converted, tmp_path):
    model, ckpt, _ = converted
    with pytest.raises(FileNotFoundError, match=r"actor.megatron.dist_checkpoint=.*nope: no such folder"):
        _engine(model, start=tmp_path / "nope")
    with pytest.raises(
        FileNotFoundError, match=r"not a megatron distributed checkpoint \(no metadata.json\)"
    ):
        _engine(model, start=model)  # a Hugging Face folder
    with pytest.raises(FileExistsError, match="is not empty"):
        hf_to_mcore(model, ckpt)


def test_a_checkpoint_of_another_model_names_the_keys(converted, tmp_path):
    _, ckpt, _ = converted
    two_layers = save_tiny(tmp_path / "two", num_layers=2)
    with pytest.raises(ValueError) as info:
        _engine(two_layers, start=ckpt)
    assert "decoder.layers.self_attention.linear_qkv.weight (4, 512, 256) (the model's (2, 512, 256))" in str(
        info.value
    )
    untied = save_tiny(tmp_path / "untied", tie_word_embeddings=False)
    with pytest.raises(ValueError, match="the model needs weights it does not hold: output_layer.weight"):
        _engine(untied, start=ckpt)
    untied_ckpt = hf_to_mcore(untied, tmp_path / "untied_mcore")
    with pytest.raises(ValueError, match="it holds weights the model does not have: output_layer.weight"):
        _engine(save_tiny(tmp_path / "tied"), start=untied_ckpt)


# --- TP = 2 over two spawned ranks: the one-rank checkpoint resharded on load --------------------------------


def _tp2_rank(rank: int, model: str, ckpt: str, store: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    try:
        from_hf = _log_probs(_engine(Path(model), tp=2))
        started = _log_probs(_engine(Path(model), start=Path(ckpt), tp=2))
        torch.save({"from_hf": from_hf, "started": started}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_tensor_parallel_ranks_load_the_one_rank_checkpoint(converted, tmp_path):
    model, ckpt, from_hf = converted
    start_ranks(
        _tp2_rank, (str(model), str(ckpt), str(tmp_path / f"store-{uuid.uuid4().hex}"), str(tmp_path)), 2
    )
    one_rank = _log_probs(from_hf)
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(result["started"], result["from_hf"])
        torch.testing.assert_close(result["started"], one_rank, atol=1e-5, rtol=0)

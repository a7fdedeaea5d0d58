"""LoRA's starting points and exclusions on the FSDP2 engine, and a vision-language actor's frozen vision tower
(one gloo rank in this process, tiny models).

- `actor.lora.adapter_path`: the engine starts from a PEFT adapter folder (non-zero B): its log-probs equal those
  of PEFT's own model loaded from that folder, and the reference (adapters off) is the base model.
- `lora.exclude_modules`: excluded modules get no adapter and do not move after an optimizer step; an entry
  that names no module is an error.
- `actor.freeze_vision_tower`: the tower's parameters get no gradient and no optimizer state and do not move,
  while the language model does; the weights streamed to the rollout still hold the tower.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.config.schema import ActorLoraConfig, LoraConfig
from tandem.engine.fsdp.weights import full_tensor

from .fsdp_scenarios import logits_fn, make_engine, rollout_batch, train


def save_peft_adapter(model_path, folder, **config) -> None:
    """A PEFT adapter of the model in `model_path`, with every A and B drawn at random (B != 0: the adapter
    changes the outputs), saved by PEFT itself."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model = get_peft_model(base, PeftLoraConfig(**config))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(folder)


def peft_logits(model_path, folder, batch) -> torch.Tensor:
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, folder).eval()
    with torch.no_grad():
        return model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits


def real_log_probs(logits, batch) -> torch.Tensor:
    """Each real token's log-prob of the next one (the rows' prompts are left-padded)."""
    log_probs = logits[:, :-1].float().log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    return log_probs[batch["attention_mask"][:, 1:].bool() & batch["attention_mask"][:, :-1].bool()]


def test_an_adapter_start_equals_peft_loading_the_saved_adapter(one_rank, tmp_path):
    folder = tmp_path / "adapter"
    save_peft_adapter(one_rank, folder, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    probe = rollout_batch(4, seed=1)
    expected = peft_logits(one_rank, folder, probe)
    # rank 0 and all-linear: the engine takes the folder's own config (the config check fills these keys too)
    engine = make_engine(one_rank, "lm", lora=ActorLoraConfig(adapter_path=str(folder)))
    got = engine.forward(probe, logits_fn, 2)["logits"]
    torch.testing.assert_close(real_log_probs(got, probe), real_log_probs(expected, probe), rtol=0, atol=1e-5)
    adapted = {name.rsplit(".lora_", 1)[0] for name, p in engine.model.named_parameters() if p.requires_grad}
    assert len(adapted) == 3 * engine.config.num_hidden_layers and all(
        n.endswith(("q_proj", "v_proj", "down_proj")) for n in adapted
    )
    # the reference, adapters off, is the base model; the adapter moves the log-probs away from it
    base = engine.without_adapter().forward(probe, logits_fn, 2)["logits"]
    plain = AutoModelForCausalLM.from_pretrained(one_rank, dtype=torch.float32)
    with torch.no_grad():
        base_expected = plain(
            input_ids=probe["input_ids"],
            attention_mask=probe["attention_mask"],
            position_ids=probe["position_ids"],
        ).logits
    torch.testing.assert_close(
        real_log_probs(base, probe), real_log_probs(base_expected, probe), rtol=0, atol=1e-5
    )
    assert (real_log_probs(got, probe) - real_log_probs(base, probe)).abs().max() > 1e-3
    # saved again, the adapters are the folder's (the same names, values and config PEFT loads)
    engine.save_adapter(tmp_path / "again")
    torch.testing.assert_close(
        real_log_probs(peft_logits(one_rank, tmp_path / "again", probe), probe),
        real_log_probs(expected, probe),
        rtol=0,
        atol=1e-5,
    )


def test_an_adapter_that_does_not_fit_the_model_is_an_error(one_rank, tmp_path):
    folder = tmp_path / "adapter"
    save_peft_adapter(one_rank, folder, r=4, lora_alpha=8, target_modules=["q_proj"])
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "adapter_model.safetensors")
    first = sorted(weights)[0]
    weights[first] = weights[first][:2]  # a rank-2 tensor where the config says 4
    save_file(weights, folder / "adapter_model.safetensors")
    with pytest.raises(
        ValueError,
        match=r"does not fit the adapters .* other shapes \[.model.layers.0.self_attn.q_proj.lora_A.default.weight \(2, 256\)",
    ):
        make_engine(one_rank, "lm", lora=ActorLoraConfig(adapter_path=str(folder)))


def test_excluded_modules_get_no_adapter_and_do_not_move(one_rank):
    # a regular expression (verl's string form) and a name's end (its list form), one of each
    lora = LoraConfig(rank=4, alpha=8.0, exclude_modules=[r"model\.layers\.0\..*", "o_proj"])
    engine = make_engine(one_rank, "lm", lora=lora)
    adapted = sorted({n.rsplit(".lora_", 1)[0] for n, p in engine.model.named_parameters() if ".lora_" in n})
    assert adapted and not [n for n in adapted if n.startswith("model.layers.0.") or n.endswith("o_proj")]
    layers = engine.config.num_hidden_layers
    assert len(adapted) == (layers - 1) * 6  # q, k, v, gate, up, down of every layer but the first
    before = {name: full_tensor(p, engine.device).clone() for name, p in engine.model.named_parameters()}
    train(engine, "lm", rollout_batch(6, seed=2), 1, 0)
    after = {name: full_tensor(p, engine.device) for name, p in engine.model.named_parameters()}
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert moved and all("lora_B" in n or "lora_A" in n for n in moved)
    assert not [n for n in after if ("layers.0." in n or "o_proj" in n) and ".lora_" in n]


def test_an_exclusion_that_names_no_module_is_an_error(one_rank):
    lora = LoraConfig(rank=4, alpha=8.0, exclude_modules=["visual", "o_proj"])  # a text model has no tower
    with pytest.raises(
        ValueError, match=r"lora.exclude_modules: \['visual'\] name no module of Qwen2ForCausalLM"
    ):
        make_engine(one_rank, "lm", lora=lora)


@pytest.fixture(scope="module")
def vlm_path(one_rank, tmp_path_factory):
    from tandem.models.tiny_vlm import save_tiny_vlm

    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


def test_a_frozen_vision_tower_gets_no_gradient_nor_optimizer_state_and_still_syncs(vlm_path):
    from tandem.config.schema import FSDPConfig

    from . import vision_scenarios as vs

    engine = make_engine(vlm_path, "lm", fsdp=FSDPConfig(param_dtype="float32"), freeze_vision_tower=True)
    params = dict(engine.model.named_parameters())
    tower = {name for name in params if name.startswith("model.visual.")}
    assert tower and len(tower) < len(params)
    before = {name: full_tensor(p, engine.device).clone() for name, p in params.items()}
    batch = vs.prompt_batch(vlm_path).select(*vs.INPUTS)  # rows 0 and 2 hold an image
    assert engine.train_step(batch, vs.nll, 2).grad_norm > 0
    in_optimizer = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    for name in tower:
        assert not params[name].requires_grad and params[name].grad is None, name
        assert id(params[name]) not in in_optimizer and params[name] not in engine.optimizer.state, name
        assert torch.equal(full_tensor(params[name], engine.device), before[name]), name
    # every weight of the language model moved (its embeddings of the unused ids too: AdamW's weight decay)
    moved = {n for n in params if not torch.equal(full_tensor(params[n], engine.device), before[n])}
    assert moved == set(params) - tower
    # the rollout's weights (what a sync streams): every tensor of the model, the tower's as transformers reads the
    # folder's
    from transformers import AutoModelForImageTextToText

    from tandem.models.without_torchvision import adapt_transformers

    adapt_transformers()
    folder = AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32).state_dict()
    streamed = dict(engine.state_dict_iter())
    assert set(streamed) == set(folder) - {"lm_head.weight"}  # the tied head once, as the embedding
    for name in tower:
        torch.testing.assert_close(streamed[name], folder[name], rtol=0, atol=0, msg=name)

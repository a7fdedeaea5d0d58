"""Why actor.router_replay=R3 is refused: what the installed vLLM needs to return the experts it routed each token
to, and that this install cannot give it (a test that fails, and so says R3 may be buildable, when vLLM or its
Triton changes).

vLLM 0.32 returns routed experts (`enable_return_routed_experts`; `CompletionOutput.routed_experts`, one row
[layers, k] per token of prompt + response but the last sampled token, which no forward saw) through its
AuxOutput connector, which it wires to Model Runner V2 alone. Model Runner V2 is written in Triton kernels (input
preparation, sampling); on vLLM's CPU build it needs Triton's CPU backend, which the released triton wheels do not
carry (they hold the nvidia and amd backends). So vLLM refuses the engine's configuration here, with or without
VLLM_USE_V2_MODEL_RUNNER=1, before any model is loaded."""

import dataclasses

import pytest

from tandem.config import ConfigError, load_config
from tandem.models.tiny import save_tiny

from .test_vllm import TINY_VLLM

pytestmark = pytest.mark.slow  # imports vLLM (seconds)


def test_vllm_has_the_routed_experts_api_r3_would_read():
    from vllm import CompletionOutput, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    assert EngineArgs(model="unused").enable_return_routed_experts is False
    assert SamplingParams().routed_experts_prompt_start == 0  # 0: rows for every prompt token
    assert "routed_experts" in {field.name for field in dataclasses.fields(CompletionOutput)}


def test_this_vllm_cannot_return_routed_experts_model_runner_v2_needs_triton(tmp_path):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    assert current_platform.is_cpu() and not HAS_TRITON  # vLLM's CPU build, no Triton CPU backend
    moe = save_tiny(tmp_path / "moe", **TINY_VLLM, num_experts=4, experts_per_token=2)
    args = EngineArgs(
        model=str(moe),
        enable_return_routed_experts=True,
        enable_prefix_caching=True,  # also required by vLLM for routed experts
        enforce_eager=True,
        max_model_len=64,
    )
    # without VLLM_USE_V2_MODEL_RUNNER: "AuxOutput Connector requires Model Runner V2; set ...=1";
    # with it: "Model Runner V2 requires Triton."
    with pytest.raises(ValueError, match="Model Runner V2"):
        args.create_engine_config()


def test_r3_is_refused_naming_what_is_missing():
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=["actor.router_replay=R3"])
    message = str(refused.value)
    assert "actor.router_replay=R3" in message
    assert "Model Runner V2, which needs Triton" in message and "use R2" in message

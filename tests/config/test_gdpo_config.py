"""algorithm.gdpo_reward_keys / gdpo_reward_weights: verl's keys load, and every wrong setting names its
keys and the fix."""

from config_helpers import error_of, load

from tandem.config.verl.translate import translate_overrides

GDPO = "algorithm.adv_estimator=gdpo"


def test_verls_keys_load_with_hydras_plus():
    alg = load(
        GDPO, "+algorithm.gdpo_reward_keys=[correct,format]", "+algorithm.gdpo_reward_weights=[1,0.5]"
    ).algorithm
    assert alg.gdpo_reward_keys == ["correct", "format"]
    assert alg.gdpo_reward_weights == [1.0, 0.5]
    assert load(GDPO, "algorithm.gdpo_reward_keys=[correct]").algorithm.gdpo_reward_weights is None
    assert load().algorithm.gdpo_reward_keys == []


def test_gdpo_needs_its_keys():
    msg = error_of(GDPO)
    assert "algorithm.gdpo_reward_keys" in msg and "fields your scorer returns" in msg


def test_weights_must_match_the_keys_in_length():
    msg = error_of(GDPO, "algorithm.gdpo_reward_keys=[correct,format]", "algorithm.gdpo_reward_weights=[1.0]")
    assert "algorithm.gdpo_reward_weights has 1 weights ([1.0])" in msg
    assert "algorithm.gdpo_reward_keys has 2 keys (['correct', 'format'])" in msg
    assert "one weight per key" in msg


def test_keys_belong_to_gdpo_only():
    msg = error_of("algorithm.gdpo_reward_keys=[correct,format]")
    assert (
        "algorithm.gdpo_reward_keys is read by adv_estimator=gdpo only" in msg and "adv_estimator=grpo" in msg
    )
    assert "gdpo_reward_weights is read by" in error_of("algorithm.gdpo_reward_weights=[1.0]")


def test_keys_are_terms_named_once():
    msg = error_of(GDPO, "algorithm.gdpo_reward_keys=[score,format,format]")
    assert "['score'] cannot name a term" in msg and "['format'] appear more than once" in msg


def test_what_gdpo_would_ignore_is_refused():
    keys = "algorithm.gdpo_reward_keys=[correct,format]"
    assert "algorithm.use_kl_in_reward=false" in error_of(GDPO, keys, "algorithm.use_kl_in_reward=true")
    msg = error_of(GDPO, keys, "reward.reward_model.enable=true", "reward.reward_model.model_path=/m")
    assert "reward.reward_model.enable=false" in msg


def test_verls_gdpo_reward_manager_points_to_the_keys():
    translation = translate_overrides(["reward.reward_manager.name=gdpo"])
    assert translation.overrides == ["reward.manager=naive"]  # the per-sample manager keeps every field
    assert "algorithm.gdpo_reward_keys" in translation.mapped[0][2]

"""docs/DESIGN.md's "where the next things go" for a verl key, kept true: a key of verl's that maps onto a Tandem
setting is one line in one table of config/verl/ (keys.py here), and the translation, `tandem config` and
`load_config` read it with nothing else changed. The key below is made up (verl has no such key), so the test
holds for a key a new verl release adds."""

from __future__ import annotations

from tandem.config import load_config
from tandem.config.verl import keys as verl_keys
from tandem.config.verl import translate_overrides
from tandem.config.verl.rules import maps

NEW = "actor_rollout_ref.actor.a_knob_of_a_new_release"


def test_a_new_key_is_one_table_line(monkeypatch):
    before = translate_overrides([f"{NEW}=0.25"])
    assert before.overrides == [] and [key for key, _ in before.problems] == [NEW]  # unknown: refused by name

    monkeypatch.setitem(verl_keys.VERL_KEYS, NEW, maps("actor.grad_clip", "a new release's knob"))
    after = translate_overrides([f"{NEW}=0.25"])
    assert (after.overrides, after.problems) == (["actor.grad_clip=0.25"], [])
    assert after.mapped == [(f"{NEW}=0.25", "actor.grad_clip=0.25", "a new release's knob")]
    assert load_config("grpo", [f"{NEW}=0.25"]).actor.grad_clip == 0.25

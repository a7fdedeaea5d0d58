"""GRPO and PPO for 3 steps each on the tiny model (2 Ray ranks, the HF rollout, seed 0; the trainer tests'
helpers), their metrics written as JSON without the timing, throughput and memory ones: run it at two commits
and compare the files, to show a change that should not move a number moved none (a run is reproducible on one
host, not across hosts).

    git worktree add /tmp/before REV && cd /tmp/before && PYTHONPATH=src:tests python scripts/step_metrics.py /tmp/before.json
    cd - && PYTHONPATH=src:tests python scripts/step_metrics.py /tmp/after.json && cmp /tmp/before.json /tmp/after.json
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "tests")
from trainer.trainer_helpers import make_assets, run_config  # noqa
from tandem.trainer import RLTrainer
from tandem.trainer.tracking import read_jsonl

SKIP = ("timing", "perf/", "memory/", "time", "second")  # wall times, tokens per second, memory
tmp = Path(tempfile.mkdtemp())
assets = make_assets(tmp / "assets")
out = {}
for preset in ("grpo", "ppo"):
    cfg = run_config(
        assets, tmp / preset, preset, "trainer.total_training_steps=3", "rollout.engine=hf", "trainer.seed=0"
    )
    trainer = RLTrainer(cfg)
    trainer.fit()
    rows = read_jsonl(trainer.run_dir / "metrics.jsonl")
    out[preset] = [{k: v for k, v in r.items() if not any(s in k for s in SKIP)} for r in rows]
Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True))
print({p: len(r) for p, r in out.items()})

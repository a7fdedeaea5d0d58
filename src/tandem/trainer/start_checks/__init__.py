"""Start-up checks of what the config points at, run in the trainers' constructors before any worker starts,
one concern a module; callers import from the module:

- `available.py`: `check_available`, the engines and models a config names (composed of the three below);
- `rollout_engine.py`: every check that depends on which rollout engine it is (vLLM's reading of the model);
- `training_engine.py`: the training engine's own check, model-config overrides, attention kernels, megatron
  distributed checkpoints; `vision_language.py`: what a vision-language actor runs with yet;
- `model_folders.py`: the model and tokenizer folders a run reads;
- `tokenizers.py`: loading the tokenizers and the processor, and their round trip on the run's own prompts;
- `rows.py`: every row's data_source and ground truth against its scorer;
- `multi_turn.py`: the agent loop's tool and interaction files and the rows' verl fields for them.

A problem is an error naming the key, folder, file, row or field (exit status 2 through the CLI); a tokenizer
that changes the text is a warning.
"""

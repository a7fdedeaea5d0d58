"""The rules of config validation, one module per section (tandem/config/validate.py runs them in order).

Every rule names the keys involved and says how to fix them; the rules that tie rollout.mode,
rollout.layout and trainer.async_mode together are in tandem/config/modes.py.
"""

"""Facts about models that every layer above reads: model types, tensor-parallel cut rules, the tiny
models the tests and the quickstart build in code, and the small adapters a library needs to run here.

Knows nothing of datasets, engines, rollouts or Ray (it sits under data/, engine/ and rollout/).
"""

"""The operator's reconcile loop, without kopf: read facts, decide (pure), act, write status once.

docs/architecture.md maps each behaviour to its module.
"""

"""The contract (``trainer.contract``), the planner (``trainer.planner``) and the training program (everything else:
``python -m trainer --spec spec.json``). Importing this package loads nothing: the web process and the workers use
the contract and the planner without torch (docs/architecture.md)."""

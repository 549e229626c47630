"""The benchmarks: programs that measure the product and print each figure beside its target, laid out like the
packages they measure (``bench.trainer``, ``bench.trainer.planner``, ``bench.workers``, ``bench.webapp``,
``bench.deploy``). Each runs from the repository root as ``python -m bench.<module>``. No product module imports
them (an import-linter contract in pyproject.toml) and they are not shipped with the product; tests import their
helpers."""

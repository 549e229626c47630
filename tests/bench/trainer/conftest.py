"""The trainer's tests' prepared dataset (tests/trainer/conftest.py), which the benchmarks' tests train on too."""
from tests.trainer.conftest import dataset  # noqa: F401  (a fixture)

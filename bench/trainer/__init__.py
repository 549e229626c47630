"""``python -m bench.trainer``: the training program's benchmarks (see __main__.py for the sections)."""

"""Benchmarks of the workers: live run data (ingestion, the chart query, a reconcile pass) on PostgreSQL."""

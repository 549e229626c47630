"""Metric series for charts: written at ingestion with their rollups, read downsampled with extremes kept."""

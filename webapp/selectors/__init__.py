"""Reads across relations for the pages: what a page shows, fetched in a few queries whatever its size."""

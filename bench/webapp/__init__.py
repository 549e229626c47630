"""Benchmarks of the web app: the pages' server time and the bytes a chart fetches, with a large database."""

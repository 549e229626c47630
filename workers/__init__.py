"""Celery workers: tasks, launchers and ingesters. Imports no torch at module import time."""

"""Reads: what the API, the pages, the admin and the workers ask of the database and of the run folders, answered
without changing anything, each module named for its concept. Every query that joins another model's table is here;
a service that needs a read calls one of these. Writes are in webapp.services, pictures in webapp.rendering
(tests/test_layers.py and the import contracts of pyproject.toml check all three)."""

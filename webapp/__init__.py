"""The Django side: models, services, REST API, admin. Never imports torch (see docs/architecture.md)."""

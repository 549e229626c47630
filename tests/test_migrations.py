from io import StringIO

from django.core.management import call_command


def test_it_has_a_migration_for_every_model_change(db):
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()

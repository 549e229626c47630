"""manage.py first_signin: while no admin can sign in with a password, print a one-time sign-in link for one.

    python manage.py first_signin [--url http://127.0.0.1:8000] [--username admin]

On a database without such an admin it makes one (``--username``, no password) and prints a link that signs it in
once, within an hour, and then asks for a password (webapp.services.first_signin). Once an admin has a password it
prints nothing: sign in as usual. The run command calls it on every start and shows the link on its terminal only.
"""
from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from webapp.services.first_signin import NameTaken, first_admin_waiting, signin_link_token


class Command(BaseCommand):
    help = "Print a one-time sign-in link for the first admin, while no admin can sign in with a password."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="where the web server answers")
        parser.add_argument("--username", default="admin", help="the admin to make if there is none (default admin)")

    def handle(self, *args, **options):
        try:
            admin = first_admin_waiting(options["username"])
        except NameTaken as exc:
            raise CommandError(str(exc)) from None
        if admin is not None:
            path = reverse("pages:first-signin", args=[signin_link_token(admin)])
            self.stdout.write(f"{options['url'].rstrip('/')}{path}")

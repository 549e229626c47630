"""The first admin's way in, as Jupyter prints its token: on a database where no admin can sign in yet, an admin
without a password and a one-time sign-in link for it, printed on the terminal that started the product.

A link is the user's id and a fingerprint of their sign-in state (password hash and last sign-in), signed with the
secret key and timestamped (django.core.signing). It is refused once it is older than LINK_HOURS, and once the
user has signed in or set a password since it was made: its fingerprint no longer matches. Spending it moves the
last sign-in on with a compare-and-set, so of two uses at the same moment exactly one gets in.
"""
from datetime import timedelta

from django.contrib.auth.models import User
from django.core import signing
from django.utils import timezone
from django.utils.crypto import constant_time_compare, salted_hmac

SALT = "webapp.first-signin"
LINK_HOURS = 1
AGAIN = "start the product again, or run `manage.py first_signin`, for a new link"
SPENT = f"this sign-in link has been used already: sign in with your password, or {AGAIN}"


class LinkRefused(Exception):
    """The link cannot sign anyone in; the message says why and what to do."""


class NameTaken(Exception):
    """The admin's name belongs to a user who is not an admin."""


def first_admin_waiting(username: str = "admin") -> User | None:
    """The admin a sign-in link is for while no admin can sign in with a password: the first such admin there is,
    or ``username`` made an admin without a password. None when some admin has a password already."""
    admins = list(User.objects.filter(is_superuser=True, is_active=True).order_by("pk"))
    if any(admin.has_usable_password() for admin in admins):
        return None
    if admins:
        return admins[0]
    if User.objects.filter(username=username).exists():
        raise NameTaken(f"a user named {username!r} exists and is not an admin: choose another name with --username, "
                        f"or make an admin with `manage.py createsuperuser`")
    return User.objects.create_superuser(username, email="", password=None)  # no password: set after the link


def _fingerprint(user: User) -> str:
    last = user.last_login.isoformat() if user.last_login else ""
    return salted_hmac(SALT, f"{user.pk}|{user.password}|{last}").hexdigest()


def signin_link_token(user: User) -> str:
    return signing.dumps({"user": user.pk, "state": _fingerprint(user)}, salt=SALT)


def signin_link_user(token: str) -> User:
    """The user a valid, unspent link is for; LinkRefused otherwise. Nothing is spent."""
    try:
        data = signing.loads(token, salt=SALT, max_age=timedelta(hours=LINK_HOURS))
    except signing.SignatureExpired:
        raise LinkRefused(f"this sign-in link has expired (a link lasts {LINK_HOURS} h): {AGAIN}") from None
    except signing.BadSignature:
        raise LinkRefused(f"this is not a sign-in link of this workbench: {AGAIN}") from None
    user = User.objects.filter(pk=data.get("user"), is_active=True).first()
    if user is None or not constant_time_compare(_fingerprint(user), str(data.get("state"))):
        raise LinkRefused(SPENT)
    return user


def signin_link_spend(token: str) -> User:
    """The user of a valid, unspent link, the link spent; LinkRefused otherwise (a second use included)."""
    user = signin_link_user(token)
    if not User.objects.filter(pk=user.pk, last_login=user.last_login).update(last_login=timezone.now()):
        raise LinkRefused(SPENT)
    return user

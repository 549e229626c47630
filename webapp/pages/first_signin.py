"""The first admin's one-time sign-in link (webapp.services.first_signin), and the password it then asks for.

Opening the link shows whom it signs in and a button: a link preview or a prefetch that only reads the page does not
spend it. The button signs in once and goes on to the password form, offered only to a user without a password (one
who has a password changes it in the admin, giving the old one).
"""
from django.contrib import messages
from django.contrib.auth import login, update_session_auth_hash
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import SetPasswordForm
from django.contrib.auth.password_validation import password_validators_help_texts
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.cache import never_cache

from ..services.first_signin import LinkRefused, signin_link_spend, signin_link_user


@never_cache
def signin(request, token: str):
    try:
        user = signin_link_spend(token) if request.method == "POST" else signin_link_user(token)
    except LinkRefused as refused:
        return render(request, "pages/first_signin.html", {"refused": str(refused)}, status=403)
    if request.method != "POST":
        return render(request, "pages/first_signin.html", {"who": user})
    login(request, user)
    return redirect("pages:set-password")


@never_cache
@login_required
def set_password(request):
    if request.user.has_usable_password():
        return redirect("pages:dashboard")
    form = SetPasswordForm(request.user, request.POST or None)
    if request.method == "POST" and form.is_valid():
        update_session_auth_hash(request, form.save())
        messages.success(request, f"Your password is set: sign in as {request.user.username} with it from now on.")
        return redirect("pages:dashboard")
    return render(request, "pages/set_password.html", {"form": form, "hints": password_validators_help_texts()},
                  status=400 if form.errors else 200)


urlpatterns = [
    path("signin/<str:token>/", signin, name="first-signin"),
    path("password/", set_password, name="set-password"),
]

"""Signing in: a token for automation, and the limit on sign-in attempts that every login shares.

Every sign-in attempt (POST /api/token/, the API's session login, the admin's login) counts against two budgets
of REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["login"] (10 a minute by default): one per client address, one per
username tried. The address budget stops one client guessing many passwords; the username budget stops many
clients guessing one user's. Past either, the answer is 429 with Retry-After, whatever the password.
"""
import hashlib
from functools import wraps

from django.http import JsonResponse
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from ..services.demo import demo_ready


class LoginAddressThrottle(SimpleRateThrottle):
    scope = "login"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": "login-address", "ident": self.get_ident(request)}


class LoginUsernameThrottle(SimpleRateThrottle):
    scope = "login"

    def get_cache_key(self, request, view):
        data = request.data if isinstance(request, Request) else request.POST
        username = data.get("username") if hasattr(data, "get") else None
        if not isinstance(username, str) or not username:
            return None  # nothing to count against; the address budget still applies
        # hashed: a cache key of the client's own characters could be anything (and long)
        ident = hashlib.sha256(username.casefold().encode("utf-8", "surrogatepass")).hexdigest()
        return self.cache_format % {"scope": "login-username", "ident": ident}


LOGIN_THROTTLES = [LoginAddressThrottle, LoginUsernameThrottle]


def throttle_logins(view):
    """``view`` (a Django login page) with its POSTs counted against the sign-in budgets."""
    @wraps(view)
    def throttled(request, *args, **kwargs):
        if request.method == "POST":
            for throttle in (cls() for cls in LOGIN_THROTTLES):
                if not throttle.allow_request(request, None):
                    wait = int(throttle.wait() or 60) + 1
                    response = JsonResponse({"detail": f"too many sign-in attempts; try again in {wait} s"},
                                            status=429)
                    response["Retry-After"] = str(wait)
                    return response
        return view(request, *args, **kwargs)
    return throttled


class TokenView(APIView):
    """Exchange a username and password for the user's API token (created on first use); send it as
    ``Authorization: Token <key>``. Sign-in attempts are limited (429 past the limit). Like a first sign-in to the
    pages, it makes the local cluster and the user's demo dataset if they are not there yet."""

    authentication_classes = []  # the credentials are in the body; a stale token in a header must not get in the way
    permission_classes = []
    throttle_classes = LOGIN_THROTTLES

    @extend_schema(
        request=AuthTokenSerializer, auth=[],
        responses={200: inline_serializer("Token", {"token": serializers.CharField(help_text="the API token")})})
    def post(self, request):
        body = AuthTokenSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        token, _ = Token.objects.get_or_create(user=body.validated_data["user"])
        demo_ready(token.user)
        return Response({"token": token.key})

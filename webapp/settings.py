"""Settings with embedded defaults (SQLite, local Redis); every default can be overridden from the environment.

DATABASE_URL   e.g. postgres://user@127.0.0.1:5432/db (default: SQLite in var/)
REDIS_URL      Celery broker and result backend (default redis://127.0.0.1:6379/0)
WORKBENCH_VAR  folder for the SQLite file, run folders and Triton repositories (default: <repo>/var)

Production is the default: DEBUG is off unless DJANGO_DEBUG=1 (the development run command, scripts/run.sh, sets
it), the built-in secret key is refused outside DEBUG, and HTTPS-only cookies, HSTS and the HTTPS redirect are on
unless DJANGO_SECURE=0. docs/security.md describes every security variable and why it defaults as it does.
"""
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("WORKBENCH_VAR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value not in ("0", "1"):
        raise ImproperlyConfigured(f"{name}={value!r}: set it to 1 (on) or 0 (off)")
    return value == "1"


def _number(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    if not value.isascii() or not value.isdigit():
        raise ImproperlyConfigured(f"{name}={value!r}: set it to a whole number of 0 or more")
    return int(value)


def _folders(name: str, default: str) -> list[Path]:
    """Folders from a colon-separated variable."""
    return [Path(p) for p in os.environ.get(name, default).split(":") if p]


DEBUG = _flag("DJANGO_DEBUG", False)
# A test run (pytest sets PYTEST_VERSION for itself and the processes it starts) signs nothing that outlives it and
# talks plain HTTP to the test client: the secret-key refusal and the HTTPS defaults below are not for it.
TESTING = "PYTEST_VERSION" in os.environ

_BUILT_IN_KEY = "dev-only-insecure-key-change-me-in-production"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", _BUILT_IN_KEY)
if SECRET_KEY == _BUILT_IN_KEY and not DEBUG and not TESTING:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is not set, and outside development the built-in key is refused (anyone could forge "
        "sessions and CSRF tokens with it): set DJANGO_SECRET_KEY to a random value of 50 characters or more, e.g. "
        "the output of: python -c 'import secrets; print(secrets.token_urlsafe(50))'; or set DJANGO_DEBUG=1 for "
        "development on this machine")
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

# HTTPS. On by default outside DEBUG; DJANGO_SECURE=0 turns all of it off (plain HTTP on a trusted network).
SECURE = _flag("DJANGO_SECURE", not DEBUG and not TESTING)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE
SECURE_SSL_REDIRECT = SECURE and _flag("DJANGO_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = _number("DJANGO_HSTS_SECONDS", 31_536_000) if SECURE else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE and _flag("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = SECURE and _flag("DJANGO_HSTS_PRELOAD", True)
# Behind a proxy that terminates TLS, requests arrive as plain HTTP: trust its X-Forwarded-Proto header (only then:
# a client could send the header itself) so that the redirect and secure cookies see the original scheme.
if _flag("DJANGO_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
# Error reports (the DEBUG page, mails to admins) hide settings whose names say they hold credentials; URLs of the
# database and the broker carry passwords, so those are hidden too.
DEFAULT_EXCEPTION_REPORTER_FILTER = "webapp.errorreports.SettingsHidingFilter"

# Requests are bounded before any code reads them: the body's bytes (the JSON parser and form parsing both enforce
# it; uploaded files have their own limit, WORKBENCH["MAX_UPLOAD_BYTES"]) and the nesting depth of JSON.
DATA_UPLOAD_MAX_MEMORY_SIZE = _number("DJANGO_MAX_REQUEST_BYTES", 1024 * 1024)
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "webapp.apps.WorkbenchConfig",
]

MIDDLEWARE = [
    "webapp.api.errors.JSONErrorsMiddleware",  # first: it sees every answer, so each error under /api/ and /v1 is JSON
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"

TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    # Searched before the apps' own folders, so that the admin's base_site.html here adds the admin's stylesheet.
    "DIRS": [BASE_DIR / "webapp" / "templates"],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

DATABASES = {"default": dj_database_url.config(
    default=f"sqlite:///{VAR_DIR / 'workbench.sqlite3'}", conn_max_age=60)}
# Each request is one transaction: an error rolls back everything it wrote (and, on PostgreSQL, keeps the
# connection usable after a failed statement).
DATABASES["default"]["ATOMIC_REQUESTS"] = True
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The web server and the worker write the same file; wait for a lock instead of failing at once. IMMEDIATE: a
    # transaction takes the write lock when it begins, so one that read first and writes later (a request, under
    # ATOMIC_REQUESTS) waits for another writer instead of failing with "database is locked" at its first write,
    # which SQLite does at once, without waiting, to a deferred reader that would deadlock another writer.
    DATABASES["default"].setdefault("OPTIONS", {}).update(timeout=20, transaction_mode="IMMEDIATE")
    # A file (not memory) for the test database, so that a worker process in the tests can open it too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-workbench.sqlite3")}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# The pages' browser libraries are npm packages (webapp/frontend/package.json, installed from its lock file by the
# run and test commands); they are served from where npm put them, under names of their own.
FRONTEND_MODULES = BASE_DIR / "webapp" / "frontend" / "node_modules"
STATICFILES_DIRS = [("vendor/htmx", FRONTEND_MODULES / "htmx.org" / "dist"),
                    ("vendor/uplot", FRONTEND_MODULES / "uplot" / "dist")]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": [
        "webapp.api.filters.StrictFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "webapp.api.pagination.Pagination",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "webapp.api.errors.exception_handler",
    # JSON only (bounded in size and depth); the dataset upload takes multipart on its own.
    "DEFAULT_PARSER_CLASSES": ["webapp.api.parsers.BoundedJSONParser"],
    # Sign-in attempts (token, session and admin logins), per client address and per username.
    "DEFAULT_THROTTLE_RATES": {"login": os.environ.get("WORKBENCH_LOGIN_RATE", "10/min")},
    # Proxies in front of the server that append to X-Forwarded-For; 0 uses the connection's address, so that a
    # client cannot choose the address its sign-in attempts are counted under.
    "NUM_PROXIES": _number("DJANGO_NUM_PROXIES", 0),
}

# Throttle counts live in this cache. The default is per process; with several web processes give them a shared
# Redis (DJANGO_CACHE_URL=redis://127.0.0.1:6379/2) so that the limit holds across all of them.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                      "LOCATION": os.environ["DJANGO_CACHE_URL"]}
          if os.environ.get("DJANGO_CACHE_URL") else
          {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

SPECTACULAR_SETTINGS = {
    "TITLE": "LLM workbench API",
    "DESCRIPTION": "Model configs, parallelism plans, clusters, datasets, runs and their metrics, checkpoints and "
                   "profiles. Authenticate with `Authorization: Token <key>` or a browser session.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI assets come from the installed sidecar package: the page works without internet access.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Every operation documents the error answers it can give (400, 401, 403, 404, 409, …) with their bodies.
    # Conversions and dataset preparations share one set of states: one enum, named for what they are
    "ENUM_NAME_OVERRIDES": {"JobStatusEnum": "webapp.models.preparations.DatasetPreparation.Status"},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "webapp.api.schema.document_errors"],
}

CELERY_BROKER_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_TASK_ALWAYS_EAGER = False



_RUNS_ROOT = Path(os.environ.get("WORKBENCH_RUNS_ROOT", VAR_DIR / "runs"))
WORKBENCH = {
    "RUNS_ROOT": _RUNS_ROOT,
    # A cluster's own runs root (set by staff) must lie under one of these.
    "RUNS_ROOTS": _folders("WORKBENCH_RUNS_ROOTS", str(_RUNS_ROOT)),
    # Datasets must lie under one of these folders (every user may read them), under a root staff gave the user or
    # one of their groups (DataRoot), or in the user's own upload folder; so no run reads any file on the server.
    "DATA_ROOTS": _folders("WORKBENCH_DATA_ROOTS", f"{VAR_DIR / 'data'}:{BASE_DIR / 'trainer' / 'data' / 'corpus'}"),
    # Uploaded datasets: <UPLOAD_ROOT>/<user id>/<file>, each user's folder readable by that user only.
    "UPLOAD_ROOT": Path(os.environ.get("WORKBENCH_UPLOAD_ROOT", VAR_DIR / "data" / "uploads")),
    "MAX_UPLOAD_BYTES": _number("WORKBENCH_MAX_UPLOAD_MB", 100) * 1024 * 1024,
    # The admin's models directory: Hugging Face model folders placed there may be imported (nowhere else).
    "MODELS_ROOT": Path(os.environ.get("WORKBENCH_MODELS_ROOT", VAR_DIR / "models")),
    # What imports and exports write: <CONVERSIONS_ROOT>/imports/<id>/ (checkpoints), exports/<id>/ (HF folders).
    "CONVERSIONS_ROOT": Path(os.environ.get("WORKBENCH_CONVERSIONS_ROOT", VAR_DIR / "conversions")),
    # JSON nested deeper than this is refused before it is parsed (no spec nests more than a few levels).
    "MAX_JSON_DEPTH": _number("WORKBENCH_MAX_JSON_DEPTH", 64),
    # Where the workers reach this web app (a deployment's evaluation asks its /v1, as any client would).
    "URL": os.environ.get("WORKBENCH_URL", "http://127.0.0.1:8000").rstrip("/"),
    # A preparation on a Slurm cluster asks for this many CPUs on one node and encodes with one process each.
    "PREPARE_CPUS": _number("WORKBENCH_PREPARE_CPUS", 8),
    # A running job none of whose ranks has made progress for this many times its median step (and at least
    # HANG_AFTER_S seconds) is hung: it is cancelled and requeued, naming the rank the others wait for.
    "HANG_STEP_MULTIPLE": _number("WORKBENCH_HANG_STEP_MULTIPLE", 10),
    "HANG_AFTER_S": _number("WORKBENCH_HANG_AFTER_S", 300),
    # A run's next attempt on Slurm also avoids the nodes its trainer named stragglers (off: a small partition
    # could be left without room for the job).
    "EXCLUDE_STRAGGLERS": _flag("WORKBENCH_EXCLUDE_STRAGGLERS", False),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("WORKBENCH_LOG_LEVEL", "INFO")},
}

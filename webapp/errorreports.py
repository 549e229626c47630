"""What error reports may show of the settings.

Django's filter hides settings whose names contain API, KEY, PASS, SECRET, SIGNATURE or TOKEN. The URLs of the
database and the broker carry their passwords under other names (DATABASES, CELERY_BROKER_URL, REDIS_URL in the
environment), so those are hidden too, in the DEBUG page and in any report mailed or logged.
"""
import re

from django.views.debug import SafeExceptionReporterFilter


class SettingsHidingFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(r"API|KEY|PASS|SECRET|SIGNATURE|TOKEN|URL|DATABASE|BROKER|BACKEND|CACHE|DSN",
                                 flags=re.IGNORECASE)

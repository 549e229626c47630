from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from webapp.api import openai
from webapp.api.auth import TokenView, throttle_logins

urlpatterns = [
    # Sign-in pages count their attempts (webapp.api.auth); these come first, before the pages they stand in for.
    path("admin/login/", throttle_logins(admin.site.login), name="admin-login"),
    path("api/auth/login/", throttle_logins(auth_views.LoginView.as_view(template_name="rest_framework/login.html")),
         name="login"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Without OPTIONS metadata, which its HTML template cannot render (a 500): a 405 like any other method but GET
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema", metadata_class=None), name="swagger"),
    path("api/auth/", include("rest_framework.urls")),
    path("api/token/", TokenView.as_view(), name="token"),
    path("api/", include("webapp.api.urls")),
    # OpenAI-compatible (webapp.api.openai): OpenAI's paths, without trailing slashes, and its 404 for the rest
    path("v1/models", openai.ModelsView.as_view(), name="openai-models"),
    path("v1/models/<str:model>", openai.ModelView.as_view(), name="openai-model"),
    path("v1/completions", openai.CompletionsView.as_view(), name="openai-completions"),
    path("v1/chat/completions", openai.ChatCompletionsView.as_view(), name="openai-chat-completions"),
    re_path(r"^v1(?:/.*)?$", openai.NotFoundView.as_view(), name="openai-not-found"),
    # Browsers ask for it on every page, the admin's and the API's included.
    path("favicon.ico", RedirectView.as_view(url=static("workbench/favicon.svg"), permanent=True)),
    # The browser pages (webapp.pages), the dashboard at the root.
    path("", include("webapp.pages.urls")),
]

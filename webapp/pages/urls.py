from django.contrib.auth import views as auth_views
from django.urls import path

from ..api.auth import throttle_logins
from . import compare, dashboard, datasets, deploy, first_signin, playground, run_detail, wizard

app_name = "pages"
urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("login/", throttle_logins(auth_views.LoginView.as_view(template_name="pages/login.html",
                                                                redirect_authenticated_user=True)), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    *wizard.urlpatterns,
    *run_detail.urlpatterns,
    *compare.urlpatterns,
    *datasets.urlpatterns,
    *deploy.urlpatterns,
    *playground.urlpatterns,
    *first_signin.urlpatterns,
]

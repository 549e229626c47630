from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.urls import path


@login_required
def page(request, **kwargs):
    return HttpResponse("")


urlpatterns = [path("playground/", page, name="playground")]

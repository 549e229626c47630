"""The dashboard (the root URL): the runs you may see, filtered, searched, sorted and paged, each with its
progress and a loss sparkline; and, for a new user, the way to a first run."""
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render

from ..models import RunStatus
from ..selectors.runs import SPARK_HEIGHT, SPARK_WIDTH, dashboard_rows, dashboard_runs
from ..services.demo import demo_ready

PAGE_SIZE = 25
SORTS = {"newest": "-created_at", "oldest": "created_at", "name": "name", "status": "status",
         "finished": "-finished_at"}


def _runs(request):
    return dashboard_runs(request.user, status=request.GET.get("status", ""),
                          owner=request.GET.get("owner", "").strip(), search=request.GET.get("q", "").strip(),
                          order=SORTS.get(request.GET.get("sort", "newest"), SORTS["newest"]))


@login_required
def dashboard(request):
    demo_ready(request.user)
    page = Paginator(_runs(request), PAGE_SIZE).get_page(request.GET.get("page"))
    filters = request.GET.copy()
    filters.pop("page", None)
    context = {"page": page, "rows": dashboard_rows(list(page.object_list)), "statuses": RunStatus.choices,
               "sorts": list(SORTS), "filters": request.GET, "filter_query": filters.urlencode(),
               "spark_width": SPARK_WIDTH, "spark_height": SPARK_HEIGHT}
    template = "pages/dashboard_rows.html" if request.headers.get("HX-Request") else "pages/dashboard.html"
    return render(request, template, context)

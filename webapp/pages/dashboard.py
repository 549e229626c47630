"""The dashboard (the root URL): the runs you may see, filtered, searched, sorted and paged, each with its
progress and a loss sparkline; and, for a new user, the way to a first run."""
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render

from ..goodput import PARTS
from ..models import Cluster, RunStatus
from ..selectors.goodput import clusters_goodput
from ..selectors.runs import SPARK_HEIGHT, SPARK_WIDTH, dashboard_rows, dashboard_runs
from ..services.demo import demo_ready

PAGE_SIZE = 25
SORTS = {"newest": "-created_at", "oldest": "created_at", "name": "name", "status": "status",
         "finished": "-finished_at"}


def _runs(request):
    return dashboard_runs(request.user, status=request.GET.get("status", ""),
                          owner=request.GET.get("owner", "").strip(), search=request.GET.get("q", "").strip(),
                          order=SORTS.get(request.GET.get("sort", "newest"), SORTS["newest"]))


def _clusters() -> list[dict]:
    """Each cluster's goodput over all its runs, with its largest loss named; clusters no run has used yet left out."""
    clusters = list(Cluster.objects.order_by("name"))
    found = clusters_goodput(clusters)
    rows = []
    for cluster in clusters:
        goodput = found.get(cluster.pk)
        if goodput is None:
            continue
        waste = {name: s for name, s in goodput.parts.items() if name not in ("training", "unaccounted")}
        worst = max(waste, key=waste.get) if waste else None
        rows.append({"cluster": cluster, "goodput": goodput, "gpu_hours": goodput.allocated_s / 3600,
                     "queue_hours": goodput.queue_s / 3600, "worst": PARTS[worst] if worst else "",
                     "worst_share": waste[worst] / goodput.allocated_s if worst else None,
                     "node_failures": sum(cluster.node_failures.values())})
    return rows


@login_required
def dashboard(request):
    demo_ready(request.user)
    page = Paginator(_runs(request), PAGE_SIZE).get_page(request.GET.get("page"))
    filters = request.GET.copy()
    filters.pop("page", None)
    context = {"page": page, "rows": dashboard_rows(list(page.object_list)), "statuses": RunStatus.choices,
               "sorts": list(SORTS), "filters": request.GET, "filter_query": filters.urlencode(),
               "spark_width": SPARK_WIDTH, "spark_height": SPARK_HEIGHT}
    if request.headers.get("HX-Request"):
        return render(request, "pages/dashboard_rows.html", context)
    return render(request, "pages/dashboard.html", {**context, "clusters": _clusters()})

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from . import live, planner, views

router = DefaultRouter()
router.register("model-configs", views.ModelConfigViewSet)
router.register("plans", views.ParallelismPlanViewSet)
router.register("clusters", views.ClusterViewSet)
router.register("datasets", views.DatasetViewSet)
router.register("runs", views.RunViewSet)
router.register("metrics", views.MetricViewSet)
router.register("checkpoints", views.CheckpointViewSet)
router.register("profiles", views.ProfileViewSet)
router.register("tune-jobs", planner.TuneJobViewSet)

urlpatterns = [
    path("estimate/", planner.EstimateView.as_view(), name="estimate"),
    path("tune/", planner.TuneView.as_view(), name="tune"),
    path("runs/<int:pk>/updates/", live.RunUpdatesView.as_view(), name="run-updates"),
    path("", include(router.urls)),
]

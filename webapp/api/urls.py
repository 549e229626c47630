from django.urls import include, path
from rest_framework.routers import DefaultRouter

from . import advice, conversions, evaluations, live, planner, serving, timeline, views

router = DefaultRouter()
router.register("model-configs", views.ModelConfigViewSet)
router.register("plans", views.ParallelismPlanViewSet)
router.register("clusters", views.ClusterViewSet)
router.register("datasets", views.DatasetViewSet)
router.register("runs", views.RunViewSet)
router.register("metrics", views.MetricViewSet)
router.register("checkpoints", views.CheckpointViewSet)
router.register("profiles", views.ProfileViewSet)
router.register("conversions", conversions.ConversionViewSet)
router.register("evaluation-sets", evaluations.EvaluationSetViewSet)
router.register("evaluations", evaluations.EvaluationViewSet)
router.register("tune-jobs", planner.TuneJobViewSet)
router.register("triton-servers", serving.TritonServerViewSet)
router.register("deployments", serving.DeploymentViewSet)
router.register("prompt-templates", serving.PromptTemplateViewSet)

urlpatterns = [
    path("estimate/", planner.EstimateView.as_view(), name="estimate"),
    path("tune/", planner.TuneView.as_view(), name="tune"),
    path("planner/advice/", advice.AdviceView.as_view(), name="planner-advice"),
    path("runs/<int:pk>/updates/", live.RunUpdatesView.as_view(), name="run-updates"),
    path("runs/<int:pk>/profiles/<str:name>/timeline.svg", timeline.ProfileTimelineView.as_view(),
         name="run-profile-timeline"),
    path("triton-servers/<int:pk>/status/", serving.TritonServerStatusView.as_view(), name="triton-server-status"),
    path("deployments/<int:pk>/generate/", serving.DeploymentGenerateView.as_view(), name="deployment-generate"),
    path("", include(router.urls)),
]

"""Deployments as the REST API, the OpenAI-compatible API and the pages find them, with what each shows beside them."""
from django.db.models import QuerySet

from ..models import Deployment


def deployments_visible_to(user) -> QuerySet:
    """The deployments ``user`` may see (and so generate with), each with its owner, server and prompt template."""
    return Deployment.objects.visible_to(user).select_related("owner", "server", "prompt_template")


def ready_deployments(user) -> QuerySet:
    """The ready ones of those, by model name: what the playground offers."""
    return deployments_visible_to(user).filter(status=Deployment.Status.READY).order_by("model_name", "pk")


def deployments_with_lineage(user) -> QuerySet:
    """The deployments ``user`` may change, each with its server, owner, and the checkpoint, run, plan and model
    config it came from (the deploy page's list)."""
    return (Deployment.objects.editable_by(user)
            .select_related("server", "checkpoint", "checkpoint__run", "checkpoint__run__plan",
                            "checkpoint__run__model_config", "owner"))

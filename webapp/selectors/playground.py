"""The playground's templates and history, each with the rows a list of them shows."""
from django.db.models import QuerySet

from ..models import PlaygroundRecord, PromptTemplate, PromptTemplateVersion

HISTORY_SHOWN = 50


def template_versions(user) -> QuerySet:
    """Every version of the templates ``user`` may see, newest template first within its name."""
    templates = PromptTemplate.objects.visible_to(user)
    return (PromptTemplateVersion.objects.filter(prompt_template__in=templates)
            .select_related("prompt_template", "prompt_template__owner")
            .order_by("prompt_template__name", "prompt_template__owner__username", "-number"))


def playground_history(user, limit: int = HISTORY_SHOWN) -> QuerySet:
    """What ``user`` asked in the playground, newest first, each with the deployment that answered."""
    return PlaygroundRecord.objects.filter(owner=user).select_related("deployment")[:limit]

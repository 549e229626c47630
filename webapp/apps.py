from django.apps import AppConfig


class WorkbenchConfig(AppConfig):
    name = "webapp"
    label = "workbench"
    verbose_name = "LLM workbench"
    default_auto_field = "django.db.models.BigAutoField"

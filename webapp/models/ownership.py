"""Who may see and change an object: its owner and staff; everyone signed in may see a shared one."""
from django.conf import settings
from django.db import models
from django.db.models import Q


class OwnedQuerySet(models.QuerySet):
    def visible_to(self, user):
        if user.is_staff:
            return self
        return self.filter(Q(owner=user) | Q(shared=True))

    def editable_by(self, user):
        return self if user.is_staff else self.filter(owner=user)


class Owned(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    shared = models.BooleanField(default=False, help_text="Shared objects are visible (read-only) to every user.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        abstract = True

    def is_editable_by(self, user) -> bool:
        return user.is_staff or self.owner_id == user.pk

    def is_visible_to(self, user) -> bool:
        return self.shared or self.is_editable_by(user)

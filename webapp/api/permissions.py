from rest_framework import permissions


class IsOwnerOrStaffToChange(permissions.BasePermission):
    """Anyone who can see an object may read it; only its owner or staff may change or delete it."""

    message = "Only the owner (or staff) may change this object."

    def has_object_permission(self, request, view, obj):
        return request.method in permissions.SAFE_METHODS or obj.is_editable_by(request.user)


class IsStaffOrReadOnly(permissions.BasePermission):
    message = "Only staff may change clusters and servers."

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or bool(request.user and request.user.is_staff)

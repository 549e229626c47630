"""A profile's timeline picture over REST: ``GET /api/runs/<id>/profiles/<name>/timeline.svg``
(webapp.selectors.timeline reads it, webapp.rendering.timeline draws it). The run is found as RunViewSet finds one: a
run the user may not see is a 404.
"""
import re

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.generics import GenericAPIView
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import IsAuthenticated

from .. import models
from ..rendering.timeline import timeline_svg
from ..selectors.timeline import NoTimeline, profile_timeline
from .permissions import IsOwnerOrStaffToChange

SVG = "image/svg+xml"
PROFILE_NAME = re.compile(r"[^./\x00-\x1f][^/\x00-\x1f]{0,119}")
PICTURE = OpenApiResponse(OpenApiTypes.STR, description=(
    "the picture: one row a rank of its compute, exposed communication and idle spans over the profiled steps, "
    "with the micro-batch actions the trace names, and under it the same pipeline rank in the ideal schedule of the "
    "plan (or the order the trainer recorded); a time axis in ms and each row's idle share"))


class ErrorsAsJSON(BaseContentNegotiation):
    """The picture is SVG whatever the client accepts (an ``<img>`` accepts images, a script anything); the errors
    before it are the API's JSON ones, never a 406 for an Accept header that names only images."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class ProfileTimelineView(GenericAPIView):
    permission_classes = [IsAuthenticated, IsOwnerOrStaffToChange]
    content_negotiation_class = ErrorsAsJSON
    filter_backends = []
    pagination_class = None

    def get_queryset(self):
        return models.Run.objects.visible_to(self.request.user)

    @extend_schema(operation_id="runs_profile_timeline", responses={(200, SVG): PICTURE})
    def get(self, request, pk, name):
        """Where a profile's time went, rank by rank, beside the ideal pipeline schedule, as an SVG picture."""
        run = self.get_object()
        # a name a profile cannot have (the contract's plain folder names) is looked up nowhere: NUL and other
        # control characters would be an error of the database, not an answer
        plain = PROFILE_NAME.fullmatch(name) is not None
        profile = models.Profile.objects.filter(run=run, name=name).first() if plain else None
        if profile is None:
            raise NotFound(f"run {run.pk} has no profile {name!r}: profiles are listed at /api/profiles/?run={run.pk}"
                           f" (a run profiles the steps its spec's profile names)")
        try:
            svg = timeline_svg(profile_timeline(run, profile))
        except NoTimeline as exc:
            raise NotFound(str(exc)) from None
        response = HttpResponse(svg, content_type=f"{SVG}; charset=utf-8")
        response["Cache-Control"] = "private, max-age=60"  # a written profile does not change
        return response

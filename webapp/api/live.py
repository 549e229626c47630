"""A run's live data over REST: chart series, logs, events, attempts, its ranks folded, its estimate beside what
it measured, runs compared, and long polling for what is new (docs/live-data.md).

Every answer is about runs the user may see, found exactly as RunViewSet finds a run (its queryset, get_object):
a run the user may not see is a 404, the same answer as a run that does not exist.
"""
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from .. import models
from ..selectors.compare import runs_compare
from ..selectors.rank_figures import rank_summary
from ..selectors.run_logs import NoSuchLog, log_files, log_read
from ..selectors.run_updates import RunGone, run_updates
from ..selectors.runs import runs_with_parts
from ..selectors.series import series_read
from ..services.run_estimates import run_estimate_report
from .live_serializers import (IDS_PARAMETER, NAMES_PARAMETER, AttemptSerializer, CompareAnswerSerializer,
                               CompareQuery, EstimateAnswerSerializer, EventQuery, LogAnswerSerializer, LogQuery,
                               RankQuery, RankSummarySerializer, RunEventSerializer, SeriesAnswerSerializer,
                               SeriesQuery, UpdatesAnswerSerializer, UpdatesQuery)
from .outside_transaction import OutsideRequestTransaction
from .permissions import IsOwnerOrStaffToChange

# The live actions read their own query parameters: the run list's filters and ordering are not theirs.
ONE_RUN = {"detail": True, "methods": ["get"], "filter_backends": []}


def _query(serializer_class, request) -> dict:
    query = serializer_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return query.validated_data


class RunLiveData:
    """Read-only actions of RunViewSet (webapp.api.views) on a run's live data."""

    @extend_schema(parameters=[SeriesQuery, NAMES_PARAMETER], responses=SeriesAnswerSerializer)
    @action(**ONE_RUN, pagination_class=None)
    def series(self, request, pk=None):
        """Metric series for a chart: at most `points` points a series over `[start, end]`, each of `points / 2`
        bins giving its lowest and highest point, read from rollups; a narrower range gives finer detail."""
        run = self.get_object()
        query = _query(SeriesQuery, request)
        return Response(series_read(run, query["names"], query["x"], query.get("start"), query.get("end"),
                                    query["points"]))

    @extend_schema(parameters=[LogQuery], responses=LogAnswerSerializer)
    @action(**ONE_RUN, pagination_class=None)
    def logs(self, request, pk=None):
        """The run's log files (without `rank` or `file`), or a chunk of one from a byte offset."""
        run = self.get_object()
        query = _query(LogQuery, request)
        name = f"rank-{query['rank']}.log" if "rank" in query else query.get("file")
        if name is None:
            return Response({"files": log_files(run)})
        try:
            return Response(log_read(run, name, query["offset"], query["limit"]).to_dict())
        except NoSuchLog as exc:
            raise NotFound(str(exc)) from None

    @extend_schema(parameters=[EventQuery], responses=RunEventSerializer(many=True))
    @action(**ONE_RUN)
    def events(self, request, pk=None):
        """What happened to the run, oldest first; `after` gives only the events newer than the last one you have."""
        run = self.get_object()
        query = _query(EventQuery, request)
        events = models.RunEvent.objects.filter(run=run, id__gt=query.get("after", 0)).order_by("id")
        return self.get_paginated_response(RunEventSerializer(self.paginate_queryset(events), many=True).data)

    @extend_schema(responses=AttemptSerializer(many=True))
    @action(**ONE_RUN)
    def attempts(self, request, pk=None):
        """The jobs submitted for the run, first to last."""
        run = self.get_object()
        attempts = models.Attempt.objects.filter(run=run).order_by("number")
        return self.get_paginated_response(AttemptSerializer(self.paginate_queryset(attempts), many=True).data)

    @extend_schema(parameters=[RankQuery], responses=RankSummarySerializer)
    @action(**ONE_RUN, pagination_class=None)
    def ranks(self, request, pk=None):
        """Step time, throughput and peak memory of each rank over the latest steps: min, median, max over the
        ranks and the slowest rank."""
        run = self.get_object()
        return Response(rank_summary(run, _query(RankQuery, request)["steps"]))

    @extend_schema(responses=EstimateAnswerSerializer)
    @action(**ONE_RUN, pagination_class=None)
    def estimate(self, request, pk=None):
        """The planner's estimate for the run's spec (made when the run was created) beside what the run measured:
        each figure's estimate, measurement and relative error, or why it is not measured."""
        return Response(run_estimate_report(self.get_object()))

    @extend_schema(parameters=[CompareQuery, IDS_PARAMETER, NAMES_PARAMETER], responses=CompareAnswerSerializer)
    @action(detail=False, methods=["get"], filter_backends=[], pagination_class=None)
    def compare(self, request):
        """Runs side by side: each one's series binned over the same x range (the bins share their edges, so the
        curves overlay) and the plan and model fields that differ between them."""
        query = _query(CompareQuery, request)
        found = {run.pk: run for run in runs_with_parts(request.user).filter(pk__in=query["ids"])}
        missing = [str(pk) for pk in query["ids"] if pk not in found]
        if missing:
            raise NotFound(f"no run {', '.join(missing)} that you can see")
        return Response(runs_compare([found[pk] for pk in query["ids"]], query["names"], query["x"],
                                     query.get("start"), query.get("end"), query["points"]))


class RunUpdatesView(OutsideRequestTransaction, GenericAPIView):
    """Long polling for a run's live view (webapp.selectors.run_updates says why, and what a wait costs); the wait
    happens outside the request's transaction."""

    permission_classes = [IsAuthenticated, IsOwnerOrStaffToChange]
    filter_backends = []
    pagination_class = None
    serializer_class = UpdatesAnswerSerializer

    def get_queryset(self):
        return models.Run.objects.visible_to(self.request.user)

    @extend_schema(parameters=[UpdatesQuery], responses=UpdatesAnswerSerializer)
    def get(self, request, pk):
        """What is newer than the cursors you give (events, steps, status), at once if anything is, otherwise
        after waiting up to `wait` seconds for it."""
        run = self.get_object()
        query = _query(UpdatesQuery, request)
        try:
            answer = run_updates(run, query.get("after_event"), query.get("after_step"), query.get("status"),
                                 query["wait"])
        except RunGone as exc:
            raise NotFound(str(exc)) from None
        return Response({**answer, "events": RunEventSerializer(answer["events"], many=True).data})

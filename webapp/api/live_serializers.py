"""Query parameters and answers of a run's live data (webapp.api.live).

Query parameters are strings, so these are DRF's own fields (as for forms); each bounds what it takes, so that a
value out of range is a 400 naming the parameter, never a query the database refuses. The answer serializers
document the answers in the schema.
"""
import re

from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from .. import models
from ..models.evaluations import EVAL_SERIES_PREFIX
from ..models.series import SERIES_BY_NAME, SOURCE_SERIES_PREFIX
from ..selectors.run_estimates import FIGURE_KEYS, UNITS
from ..selectors.run_logs import MAX_CHUNK_BYTES
from ..selectors.run_updates import MAX_WAIT_S
from ..selectors.series import MAX_STEP, X_UNITS

MAX_POINTS = 5000
X_LIMIT = float(2**63)  # tokens seen are 64-bit integers; no x of any unit is larger
MAX_COMPARED = 10
MAX_SERIES = 40  # the charted series and, for a blend, its sources
MAX_ID = 2**63 - 1


class CommaSeparated(serializers.CharField):
    """A list in one query parameter, comma-separated (``?names=loss,lr``), each item checked by ``item``."""

    default_error_messages = {"empty": "give at least one item", "too_many": "give at most {most} items"}

    def __init__(self, item: serializers.Field, most: int, **kwargs):
        self.item, self.most = item, most
        super().__init__(max_length=1000, **kwargs)

    def to_internal_value(self, data):
        parts = [part.strip() for part in super().to_internal_value(data).split(",") if part.strip()]
        if not parts:
            self.fail("empty")
        if len(parts) > self.most:
            self.fail("too_many", most=self.most)
        return list(dict.fromkeys(self.item.run_validation(part) for part in parts))


def comma_parameter(name: str, items: dict, description: str, required: bool = False) -> OpenApiParameter:
    return OpenApiParameter(name, {"type": "array", "items": items, "minItems": 1}, OpenApiParameter.QUERY,
                            required=required, style="form", explode=False, description=description)


SOURCE_SERIES_PATTERN = rf"^{SOURCE_SERIES_PREFIX}[^,]{{1,64}}$"
EVAL_SERIES_PATTERN = rf"^{EVAL_SERIES_PREFIX}[0-9]{{1,18}}$"
NAMES_PARAMETER = comma_parameter(
    "names", {"oneOf": [{"type": "string", "enum": sorted(SERIES_BY_NAME)},
                        {"type": "string", "pattern": SOURCE_SERIES_PATTERN},
                        {"type": "string", "pattern": EVAL_SERIES_PATTERN}]},
    f"series to chart, comma-separated (default: loss); a blended run's validation loss on one of its sources is "
    f"{SOURCE_SERIES_PREFIX}<source> (main: the run's own dataset); an evaluation set's headline score on each "
    f"checkpoint is {EVAL_SERIES_PREFIX}<set id>")


class SeriesName(serializers.CharField):
    """A series' name: one of the charted series, or a blend source's validation loss."""

    default_error_messages = {"unknown": "{value!r} is not a series: give one of {names}, "
                                         f"{SOURCE_SERIES_PREFIX}<source> or {EVAL_SERIES_PREFIX}<set id>"}

    def __init__(self, **kwargs):
        super().__init__(max_length=len(SOURCE_SERIES_PREFIX) + 64, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not (value in SERIES_BY_NAME or re.match(SOURCE_SERIES_PATTERN, value)
                or re.match(EVAL_SERIES_PATTERN, value)):
            self.fail("unknown", value=value, names=", ".join(sorted(SERIES_BY_NAME)))
        return value


class Query(serializers.Serializer):
    """A query string's parameters. A parameter given empty (``?x=``) is refused, as the schema says: DRF would read
    it as left out and answer with the default, which the client did not ask for."""

    def to_internal_value(self, data):
        empty = [name for name in self.fields if name in data and data.get(name) == ""]
        if empty:
            raise serializers.ValidationError({name: ["give a value, or leave the parameter out"] for name in empty})
        return super().to_internal_value(data)


class SeriesQuery(Query):
    names = CommaSeparated(SeriesName(), most=MAX_SERIES, required=False)
    x = serializers.ChoiceField(choices=X_UNITS, default="step",
                                help_text="the x axis: step, tokens (tokens seen) or time (seconds since the first "
                                          "step began)")
    start = serializers.FloatField(required=False, min_value=-X_LIMIT, max_value=X_LIMIT,
                                   help_text="lowest x to chart (default: the run's first)")
    end = serializers.FloatField(required=False, min_value=-X_LIMIT, max_value=X_LIMIT,
                                 help_text="highest x to chart (default: the run's last)")
    points = serializers.IntegerField(min_value=2, max_value=MAX_POINTS, default=2000,
                                      help_text="at most this many points a series")

    def validate(self, attrs):
        attrs.setdefault("names", ["loss"])
        if attrs.get("start") is not None and attrs.get("end") is not None and attrs["start"] > attrs["end"]:
            raise serializers.ValidationError({"end": ["must not be below start"]})
        return attrs


class CompareQuery(SeriesQuery):
    ids = CommaSeparated(serializers.IntegerField(min_value=1, max_value=MAX_ID), most=MAX_COMPARED)


IDS_PARAMETER = comma_parameter("ids", {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                                f"the runs to compare, comma-separated (at most {MAX_COMPARED})", required=True)


class LogQuery(Query):
    rank = serializers.IntegerField(required=False, min_value=0, max_value=2**20 - 1,
                                    help_text="read logs/rank-<rank>.log")
    file = serializers.CharField(required=False, max_length=100,
                                 help_text="read this file of logs/: rank-<n>.log, launcher.log or slurm-<job>.out")
    offset = serializers.IntegerField(default=0, min_value=0, max_value=2**62, help_text="byte to start at")
    limit = serializers.IntegerField(default=65536, min_value=1, max_value=MAX_CHUNK_BYTES,
                                     help_text="most bytes to read")

    def validate(self, attrs):
        if "rank" in attrs and "file" in attrs:
            raise serializers.ValidationError({"file": ["give rank or file, not both"]})
        return attrs


class EventQuery(Query):
    after = serializers.IntegerField(required=False, min_value=0, max_value=MAX_ID,
                                     help_text="only events with a larger id (the last id you have)")


class RankQuery(Query):
    steps = serializers.IntegerField(default=100, min_value=1, max_value=1000, help_text="latest steps to fold")


class UpdatesQuery(Query):
    after_event = serializers.IntegerField(required=False, min_value=0, max_value=MAX_ID,
                                           help_text="the last event id you have (none: every event is new)")
    after_step = serializers.IntegerField(required=False, min_value=0, max_value=MAX_STEP,
                                          help_text="the last step you have (none: every step is new)")
    status = serializers.ChoiceField(required=False, choices=models.RunStatus.choices,
                                     help_text="the status you have")
    wait = serializers.FloatField(default=25.0, min_value=0, max_value=MAX_WAIT_S,
                                  help_text="seconds to wait for something newer")


# ------------------------------------------------------------------------------------------------------ answers

class SeriesPointsSerializer(serializers.Serializer):
    points = serializers.ListField(child=serializers.ListField(child=serializers.FloatField(), min_length=2,
                                                               max_length=2),
                                   help_text="[x, value] pairs in step order")
    downsampled = serializers.BooleanField(help_text="fewer points than the range holds")
    count = serializers.IntegerField(help_text="points the range holds")


class FrameSerializer(serializers.Serializer):
    start = serializers.FloatField()
    end = serializers.FloatField()
    bins = serializers.IntegerField(help_text="equal slices of [start, end]; each gives its lowest and highest point")
    bin_width = serializers.FloatField()


class SeriesAnswerSerializer(serializers.Serializer):
    x = serializers.ChoiceField(choices=X_UNITS)
    frame = FrameSerializer(allow_null=True)
    block_steps = serializers.IntegerField(help_text="steps in each rollup block read (1: every step)")
    series = serializers.DictField(child=SeriesPointsSerializer())


class ComparedRunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    x = serializers.ChoiceField(choices=X_UNITS)
    frame = FrameSerializer(allow_null=True)
    block_steps = serializers.IntegerField()
    series = serializers.DictField(child=SeriesPointsSerializer())


class DifferenceSerializer(serializers.Serializer):
    field = serializers.CharField(help_text="a dotted path: plan.tp, model.n_layers, …")
    values = serializers.ListField(child=serializers.JSONField(allow_null=True), help_text="each run's, in order")


class CompareAnswerSerializer(serializers.Serializer):
    x = serializers.ChoiceField(choices=X_UNITS)
    frame = FrameSerializer()
    runs = ComparedRunSerializer(many=True)
    differences = DifferenceSerializer(many=True)


class LogFileSerializer(serializers.Serializer):
    name = serializers.CharField()
    size = serializers.IntegerField()


class LogAnswerSerializer(serializers.Serializer):
    """Without rank or file: ``files``. With one: the chunk read."""

    files = LogFileSerializer(many=True, required=False)
    file = serializers.CharField(required=False)
    offset = serializers.IntegerField(required=False)
    next_offset = serializers.IntegerField(required=False, help_text="the offset to ask for next")
    size = serializers.IntegerField(required=False)
    more = serializers.BooleanField(required=False, help_text="bytes follow next_offset already")
    text = serializers.CharField(required=False, help_text="UTF-8; bytes that are not, as U+FFFD")


class RunEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = models.RunEvent
        fields = ["id", "time", "source", "kind", "attempt", "message", "data"]


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = models.Attempt
        fields = ["id", "number", "backend", "job_id", "resume", "why", "submitted_at", "ended_at", "state",
                  "exit_code", "reason", "counts_as_restart"]


class StepsReadSerializer(serializers.Serializer):
    first = serializers.IntegerField()
    last = serializers.IntegerField()
    count = serializers.IntegerField()


class RankFigureSerializer(serializers.Serializer):
    min = serializers.FloatField()
    median = serializers.FloatField()
    max = serializers.FloatField()
    worst_rank = serializers.IntegerField(help_text="the slowest (or fullest) rank")
    per_rank = serializers.ListField(child=serializers.FloatField(allow_null=True),
                                     help_text="each rank's median over the steps (null: the rank reports none)")


class RankSummarySerializer(serializers.Serializer):
    steps = StepsReadSerializer(allow_null=True)
    world_size = serializers.IntegerField(allow_null=True)
    slowest_rank = serializers.IntegerField(allow_null=True, help_text="the rank with the longest steps")
    figures = serializers.DictField(child=RankFigureSerializer(),
                                    help_text="step_time_s, tokens_per_s, max_allocated_bytes")


class UpdatesAnswerSerializer(serializers.Serializer):
    changed = serializers.BooleanField(help_text="something is newer than the cursors given")
    finished = serializers.BooleanField()
    status = serializers.CharField(help_text="the run's status, as the run's own field has it")
    status_message = serializers.CharField()
    last_step = serializers.IntegerField()
    events = RunEventSerializer(many=True, help_text="events after after_event, oldest first")
    more_events = serializers.BooleanField(help_text="more new events than these: ask again after the last")
    latest_step = serializers.DictField(allow_null=True, help_text="the newest step's figures, when it is new")
    waited_s = serializers.FloatField()


class EstimateSummarySerializer(serializers.Serializer):
    """The headline of the estimate stored with the run (POST /api/estimate/ gives the whole figure tree), or
    ``error`` alone when the planner made none."""

    error = serializers.CharField(required=False, help_text="why there is no estimate")
    peak_memory_bytes = serializers.FloatField(required=False, allow_null=True,
                                               help_text="the fullest rank's memory")
    peak_rank = serializers.IntegerField(required=False, allow_null=True)
    peak_stage = serializers.IntegerField(required=False, allow_null=True)
    capacity_bytes = serializers.FloatField(required=False, allow_null=True, help_text="a GPU's memory")
    fits = serializers.BooleanField(required=False, allow_null=True)
    step_time_s = serializers.FloatField(required=False, allow_null=True)
    tokens_per_s = serializers.FloatField(required=False, allow_null=True)
    mfu = serializers.FloatField(required=False, allow_null=True)
    options = serializers.DictField(required=False, help_text="the planner's options it was made with (defaults)")
    warnings = serializers.ListField(child=serializers.CharField(), required=False)


class EstimateFigureSerializer(serializers.Serializer):
    key = serializers.ChoiceField(choices=FIGURE_KEYS)
    figure = serializers.CharField(help_text="what the row is, in words")
    unit = serializers.ChoiceField(choices=UNITS)
    estimated = serializers.FloatField(allow_null=True, help_text="the planner's figure (null: not estimated)")
    measured = serializers.FloatField(allow_null=True, help_text="what the run recorded (null: not measured)")
    error = serializers.FloatField(allow_null=True, help_text="(measured − estimated) / estimated; null when either "
                                                              "is missing or the estimate is 0")
    measured_from = serializers.CharField(allow_blank=True, help_text="what the measurement was read from")
    missing = serializers.CharField(allow_blank=True, help_text="why it is not measured; empty when it is")


class EstimateAnswerSerializer(serializers.Serializer):
    estimate = EstimateSummarySerializer()
    figures = EstimateFigureSerializer(many=True)

"""A run's metric series for charts: every step's figures as plain floats, and min/max rollups of them.

metrics.jsonl also lands in ``Metric`` (one JSON row a record, for the record as written); charts read these
tables instead, which ingestion writes from the same records (webapp.services.series).

Why two tables, and why these:

- ``SeriesStep`` is one narrow row a step: where the step lies on each x axis (step, tokens seen, wall time) and
  its figures, one float column a series. One row a step, not one a point, so ingestion writes 1 row where a
  point table would write 8, and a chart of several series reads each step once. Its indexes on tokens and wall
  time turn a range given in those units into a step range at the cost of two index probes.
- ``SeriesBucket`` holds, for one series, the count, the lowest point and the highest point of an aligned block of
  steps: block ``b`` of level ``L`` covers steps ``b·4^L … (b+1)·4^L − 1``, levels 2 to 8 (16 to 65,536 steps).
  A chart asks for a step range and a number of points; the reader takes the finest level at which the range is
  at most a few thousand blocks, and the range's ragged ends from finer levels and the step rows, so a query of
  a 1,000,000-step run reads about 2,000 rows instead of 1,000,000, and a narrower range reads a finer level.
  Keeping each block's two extremes (not a mean) is what makes the downsampled curve keep every spike: the
  global minimum and maximum of any range are among the points read.
  Ingestion rewrites exactly the blocks that hold a step it wrote, from their children, so a resumed attempt that
  redoes steps leaves the rollups as if the run had never done them the first time. The blocks start at 16 steps
  (not 4) because levels of 4 and 8 steps would cost more writes than the step rows themselves while a range that
  short is read from the step rows anyway.

Both have composite primary keys (no id column, no sequence): the key is the one index a chart query walks.
"""
from django.db import models

from .runs import Run


class Series(models.IntegerChoices):
    """The charted series; the label is the series' name in the API and its SeriesStep column."""

    LOSS = 1, "loss"
    VAL_LOSS = 2, "val_loss"
    LR = 3, "lr"
    GRAD_NORM = 4, "grad_norm"
    TOKENS_PER_S = 5, "tokens_per_s"
    STEP_TIME_S = 6, "step_time_s"
    MFU = 7, "mfu"
    MEMORY = 8, "memory"  # max_allocated_bytes of rank 0


# Series that an evaluation record carries; every other series comes from a training step's record.
EVAL_SERIES = (Series.VAL_LOSS,)
TRAIN_SERIES = tuple(s for s in Series if s not in EVAL_SERIES)
SERIES_BY_NAME = {s.label: s for s in Series}
# A blended run's validation loss of one source, asked for as "val_loss:<source name>" (SourceValLoss)
SOURCE_SERIES_PREFIX = "val_loss:"


class SeriesStep(models.Model):
    """One step of a run: its place on each x axis and the value of every series there (null: not recorded)."""

    pk = models.CompositePrimaryKey("run_id", "step")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)  # the key leads with it
    step = models.PositiveIntegerField()
    tokens_seen = models.BigIntegerField(null=True)
    wall_time = models.FloatField(null=True, help_text="Seconds since the epoch when the step's record was written")
    loss = models.FloatField(null=True)
    val_loss = models.FloatField(null=True)
    lr = models.FloatField(null=True)
    grad_norm = models.FloatField(null=True)
    tokens_per_s = models.FloatField(null=True)
    step_time_s = models.FloatField(null=True)
    mfu = models.FloatField(null=True)
    memory = models.FloatField(null=True, help_text="max_allocated_bytes of rank 0")

    class Meta:
        indexes = [models.Index(fields=["run", "tokens_seen"], name="series_step_by_tokens"),
                   models.Index(fields=["run", "wall_time"], name="series_step_by_time")]


class SeriesBucket(models.Model):
    """The count, lowest and highest point of one series over block ``bucket`` of ``4**level`` steps."""

    pk = models.CompositePrimaryKey("run_id", "series", "level", "bucket")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)  # the key leads with it
    series = models.PositiveSmallIntegerField(choices=Series.choices)
    level = models.PositiveSmallIntegerField()
    bucket = models.PositiveIntegerField()
    count = models.PositiveIntegerField()
    min_value = models.FloatField()
    min_step = models.PositiveIntegerField()
    min_tokens = models.BigIntegerField(null=True)
    min_wall = models.FloatField(null=True)
    max_value = models.FloatField()
    max_step = models.PositiveIntegerField()
    max_tokens = models.BigIntegerField(null=True)
    max_wall = models.FloatField(null=True)


class SourceValLoss(models.Model):
    """A blended run's validation loss on one of its sources at one evaluation. Evaluations are few (one every
    ``eval_every`` steps), so a chart reads these rows as they are, without rollups."""

    pk = models.CompositePrimaryKey("run_id", "source", "step")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)  # the key leads with it
    source = models.CharField(max_length=64, help_text="The source's name in the blend (main: the run's dataset)")
    step = models.PositiveIntegerField()
    val_loss = models.FloatField()

"""Creating a tuning job checks its request and queues it; ranking the plans, and the trials, are the worker's."""
import time

import pytest

from tests.conftest import HEAVY_TUNE
from trainer.contract import SpecError
from webapp import models, services


def test_it_creates_a_job_without_estimating_a_plan(alice, corpus, planner_calls):
    started = time.perf_counter()
    job = services.tune_job_create(owner=alice, request=HEAVY_TUNE, dataset=corpus, trial_steps=6)
    assert time.perf_counter() - started < 2.0
    assert sum(planner_calls.values()) == 0
    assert models.TuneJob.objects.get(pk=job.pk).status == models.TuneJob.Status.PENDING


def test_it_refuses_a_bad_request_naming_the_fields_and_creates_nothing(alice, corpus, planner_calls):
    with pytest.raises(SpecError) as err:
        services.tune_job_create(owner=alice, request={**HEAVY_TUNE, "global_batch": 0, "space": {"engines": ["tpu"]}},
                                 dataset=corpus)
    assert set(err.value.errors) == {"global_batch", "space.engines"}
    assert not models.TuneJob.objects.exists() and sum(planner_calls.values()) == 0

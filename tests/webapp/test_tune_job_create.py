"""Creating a tuning job checks its request and queues it; ranking the plans, and the trials, are the worker's."""
import time
from collections import Counter

import pytest

from trainer.contract import SpecError
from trainer.planner.estimate.core import Planner
from webapp import models, services

# 175B on 64 CPU ranks and five global batches: a valid request whose tune estimates tens of thousands of plans
HEAVY = {"model": "gpt3-175b", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 64},
         "global_batch": [512, 1024, 1536, 2048, 3072]}


@pytest.fixture
def planner_calls(monkeypatch):
    """How often each Planner entry point runs: the real methods, counted."""
    calls = Counter()
    for name in ("evaluate", "quick", "stage_memory"):
        real = getattr(Planner, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(Planner, name, spy)
    return calls


def test_it_creates_a_job_without_estimating_a_plan(alice, corpus, planner_calls):
    started = time.perf_counter()
    job = services.tune_job_create(owner=alice, request=HEAVY, dataset=corpus, trial_steps=6)
    assert time.perf_counter() - started < 2.0
    assert sum(planner_calls.values()) == 0
    assert models.TuneJob.objects.get(pk=job.pk).status == models.TuneJob.Status.QUEUED


def test_it_refuses_a_bad_request_naming_the_fields_and_creates_nothing(alice, corpus, planner_calls):
    with pytest.raises(SpecError) as err:
        services.tune_job_create(owner=alice, request={**HEAVY, "global_batch": 0, "space": {"engines": ["tpu"]}},
                                 dataset=corpus)
    assert set(err.value.errors) == {"global_batch", "space.engines"}
    assert not models.TuneJob.objects.exists() and sum(planner_calls.values()) == 0

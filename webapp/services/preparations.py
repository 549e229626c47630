"""Preparing a dataset ahead of its runs (webapp.models.preparations): asked for here, run by a worker
(workers.preparing), which records what it did through the functions below (webapp.services.job_rows: claimed, how
far it is, then done or failed with a message that says what to change)."""
from django.core.exceptions import ValidationError
from django.db import transaction

from ..models import Cluster, Dataset, DatasetPreparation
from .job_rows import UNDER_WAY, job_claim, job_settle
from .tasks import TaskName, enqueue

MAX_VOCAB = 1 << 21  # the contract's bound on a model's vocabulary


@transaction.atomic
def dataset_prepare(owner, dataset: Dataset, vocab: int, cluster: Cluster | None = None) -> DatasetPreparation:
    """Queue the preparation of ``dataset`` (visible to ``owner``: the caller checks) for a model of ``vocab``
    tokens, as a job of its own on ``cluster`` when that is a Slurm cluster (a worker's process otherwise);
    ValidationError when its path may no longer be read, or while one is under way."""
    if not 1 <= vocab <= MAX_VOCAB:
        raise ValidationError({"vocab": [f"vocab={vocab} must be between 1 and {MAX_VOCAB:,}: give the vocab_size of "
                                         f"the model that will train on it"]})
    try:
        dataset.check_path()
    except ValidationError as exc:
        raise ValidationError({"dataset": exc.messages}) from None
    under_way = dataset.preparations.filter(status__in=UNDER_WAY).first()
    if under_way is not None:
        raise ValidationError({"dataset": [f"dataset {dataset.name!r} is being prepared already (preparation "
                                           f"{under_way.pk}, {under_way.status}): wait for it to end"]})
    preparation = DatasetPreparation.objects.create(dataset=dataset, owner=owner, vocab=vocab, cluster=cluster,
                                                    message="queued for preparation")
    enqueue(TaskName.DATASET_PREPARE, preparation.pk)
    return preparation


def preparation_claim(preparation_id: int) -> DatasetPreparation | None:
    return job_claim(DatasetPreparation, preparation_id, "reading the source", related=("dataset", "cluster"))


def preparation_settle(preparation: DatasetPreparation, status: str, message: str, report: dict) -> bool:
    return job_settle(preparation, status, message, report)

"""What a first run needs and a new user does not have yet: this machine as a cluster and the demo corpus as a
dataset, so that the wizard's defaults launch a run at once."""
from django.db import transaction

from trainer.contract import presets

from ..models import Cluster, Dataset

LOCAL_CLUSTER = "local"
DEMO_DATASET = "shakespeare (demo)"
LOCAL_PROCESSES = 2  # CPU ranks of the local cluster: enough for a tp=2 or pp=2 demo, and every laptop has them


@transaction.atomic
def demo_ready(user) -> tuple[Cluster, Dataset]:
    """The local cluster (made once, for everyone) and ``user``'s demo dataset (made once per user)."""
    cluster, _ = Cluster.objects.get_or_create(
        name=LOCAL_CLUSTER, defaults={"kind": Cluster.Kind.LOCAL,
                                      "spec": presets.local_cpu_cluster(LOCAL_PROCESSES).to_dict()})
    dataset, _ = Dataset.objects.get_or_create(
        owner=user, name=DEMO_DATASET,
        defaults={"path": str(presets.DEMO_TEXT), "description": "tinyshakespeare, shipped with the workbench"})
    return cluster, dataset

from .configs import Cluster, Dataset, ModelConfig, ParallelismPlan
from .dataroots import DataRoot, UserDataRoots, data_roots_for, upload_folder
from .ownership import Owned, OwnedQuerySet
from .runs import FINISHED, TRANSITIONS, Checkpoint, IllegalTransition, Metric, Profile, Run, RunStatus
from .serving import Deployment, PromptTemplate, TritonServer
from .tuning import TuneJob

__all__ = ["Cluster", "Dataset", "ModelConfig", "ParallelismPlan", "DataRoot", "UserDataRoots", "data_roots_for",
           "upload_folder", "Owned", "OwnedQuerySet", "FINISHED", "TRANSITIONS", "Checkpoint", "IllegalTransition",
           "Metric", "Profile", "Run", "RunStatus", "Deployment", "PromptTemplate", "TritonServer", "TuneJob"]

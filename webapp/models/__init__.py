from .calibration import CalibrationRecord, ClusterCalibration
from .configs import Cluster, Dataset, ModelConfig, ParallelismPlan
from .conversions import CheckpointConversion
from .history import Attempt, RunEvent
from .evaluations import Evaluation, EvaluationSet
from .dataroots import DataRoot, UserDataRoots, data_roots_for, upload_folder
from .ownership import Owned, OwnedQuerySet
from .playground import PlaygroundRecord, PromptTemplateVersion
from .preparations import DatasetPreparation
from .runs import FINISHED, TRANSITIONS, Checkpoint, IllegalTransition, Metric, Profile, Run, RunStatus
from .series import Series, SeriesBucket, SeriesStep, SourceValLoss
from .serving import Deployment, PromptTemplate, TritonServer
from .tuning import TuneJob

__all__ = ["CheckpointConversion", "DatasetPreparation", "Evaluation", "EvaluationSet",
           "CalibrationRecord", "ClusterCalibration", "Attempt", "RunEvent", "Cluster", "Dataset", "ModelConfig", "ParallelismPlan", "DataRoot", "UserDataRoots", "data_roots_for",
           "upload_folder", "Owned", "OwnedQuerySet", "FINISHED", "TRANSITIONS", "Checkpoint", "IllegalTransition",
           "Metric", "Profile", "Run", "RunStatus", "Series", "SeriesBucket", "SeriesStep", "SourceValLoss", "Deployment",
           "PromptTemplate", "TritonServer", "TuneJob", "PlaygroundRecord", "PromptTemplateVersion"]

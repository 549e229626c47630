"""Business operations named <entity>_<verb>; views and admin call these instead of touching models directly."""
from .datasets import dataset_upload
from .runs import run_access_problems, run_cancel, run_check, run_create, run_queue
from .tasks import enqueue
from .tuning import tune_job_create, tune_job_dataset_problem, tune_job_finish, tune_job_progress, tune_job_start

__all__ = ["dataset_upload", "run_access_problems", "run_cancel", "run_check", "run_create", "run_queue", "enqueue",
           "tune_job_create", "tune_job_dataset_problem", "tune_job_finish", "tune_job_progress", "tune_job_start"]

"""Writes: business operations named <entity>_<verb> that change rows, run folders, queued tasks or a Triton server;
views, the admin and the workers call these instead of changing models directly. What they read comes from
webapp.selectors; nothing here draws (webapp.rendering, the templates)."""
from .checkpoints import checkpoint_import_register
from .conversions import checkpoint_export_hf, checkpoint_import_hf
from .datasets import dataset_upload
from .deployments import (deployment_access_problem, deployment_create, deployment_generate, deployment_stream,
                          deployment_undeploy)
from .runs import (default_source_name, launch_send, run_access_problems, run_cancel, run_check, run_create,
                   run_queue)
from .tasks import enqueue
from .triton import triton_server_status
from .tuning import tune_job_create, tune_job_dataset_problem, tune_job_claim, tune_job_finish, tune_job_progress

__all__ = ["checkpoint_import_register", "checkpoint_export_hf", "checkpoint_import_hf", "dataset_upload",
           "deployment_access_problem", "deployment_create",
           "deployment_generate", "deployment_stream", "deployment_undeploy", "run_access_problems", "run_cancel",
           "run_check", "run_create", "run_queue", "launch_send", "default_source_name", "enqueue", "triton_server_status", "tune_job_create",
           "tune_job_claim", "tune_job_dataset_problem", "tune_job_finish", "tune_job_progress"]

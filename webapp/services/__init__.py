"""Business operations named <entity>_<verb>; views and admin call these instead of touching models directly."""
from .runs import run_cancel, run_create, run_queue, run_spec
from .tasks import enqueue

__all__ = ["run_cancel", "run_create", "run_queue", "run_spec", "enqueue"]

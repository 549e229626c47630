"""The DeepSpeed engine (``engine.DeepSpeedEngine``), imported only when a plan says engine='deepspeed'.

DeepSpeed picks its accelerator when it is first imported and reads DS_ACCELERATOR to do so; every module of this
package imports deepspeed, so the package names the accelerator before any of them loads.
"""
import os

import torch

os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")

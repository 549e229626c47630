"""Real learning on real text: a short run on tinyshakespeare ends well below the unigram entropy of its tokens,
and the checkpoint generates text."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO
from trainer.data import load_tokens, prepare_dataset, unigram_entropy
from trainer.contract.presets import DEMO_TEXT, local_cpu_cluster
from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec

pytestmark = pytest.mark.slow


def test_it_learns_tinyshakespeare_below_the_unigram_entropy_and_generates_text(tmp_path):
    dataset = DatasetSpec(path=str(DEMO_TEXT), prepared_dir=str(tmp_path / "data"))
    prepared = prepare_dataset(dataset, 512)
    entropy = unigram_entropy(load_tokens(prepared.val_path))
    model = ModelSpec(n_layers=2, d_model=64, n_heads=4, seq_len=64, vocab_size=512)
    spec = RunSpec(model=model, plan=ParallelPlan(micro_batch=16, global_batch=16), cluster=local_cpu_cluster(1),
                   dataset=dataset, output_dir=str(tmp_path / "run"), steps=300, eval_every=300, eval_batches=8,
                   checkpoint_every=300, optimizer=OptimizerSpec(lr=3e-3, min_lr=3e-4, warmup_steps=20)).validate()
    (tmp_path / "spec.json").write_text(spec.to_json())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "trainer", "--spec", str(tmp_path / "spec.json")], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=600)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val_loss = [r["val_loss"] for r in records if "val_loss" in r][-1]
    assert val_loss < entropy - 1.0, f"validation loss {val_loss:.3f} against unigram entropy {entropy:.3f} nats"

    generated = subprocess.run(
        [sys.executable, "-m", "trainer.generate", "--checkpoint", str(tmp_path / "run" / "checkpoints" / "step-300"),
         "--prompt", "ROMEO:", "--max-new-tokens", "40", "--seed", "1"],
        cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=300).stdout
    new_text = generated.split("ROMEO:", 1)[1]
    letters = np.mean([c.isalpha() or c.isspace() or c in ",.;:'!?-" for c in new_text])
    assert len(new_text.strip()) > 20 and letters > 0.9, generated

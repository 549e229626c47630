"""A run may start from a checkpoint's weights (RunSpec.init_from): any plan or engine saved it, the run trains with
its own plan and a fresh optimizer from step 0, unless its own folder has a checkpoint to resume from."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.trainer.launch import launch, losses, records, tiny_spec
from trainer.contract import InitFrom
from trainer.contract.manifest import latest_checkpoint, read_manifest

pytestmark = pytest.mark.slow
STEPS = 2


def _init(folder: Path, **kw) -> InitFrom:
    return InitFrom(checkpoint=str(folder), **kw)


@pytest.fixture(scope="module")
def init_runs(tmp_path_factory, dataset) -> Path:
    """One single-process launch: a native source (grad_accum 4, full recompute) and a DeepSpeed ZeRO-1 source,
    then runs started from them under other plans and engines, and one started, stopped and resumed."""
    runs = tmp_path_factory.mktemp("init-runs")
    saved = dict(checkpoint_every=STEPS)
    native_src = runs / "src-native" / "checkpoints" / f"step-{STEPS}"
    ds_src = runs / "src-ds" / "checkpoints" / f"step-{STEPS}"

    def job(name, resume=False, stop_at=0, **kw):
        spec = tiny_spec(runs / name, dataset, STEPS, **kw)
        return {"spec": spec, "run_dir": spec.output_dir, "resume": resume, "stop_at": stop_at}

    from_native = dict(micro_batch=4, init_from=_init(native_src), **saved)
    jobs = [job("src-native", activation_checkpointing="full", **saved),
            job("src-ds", engine="deepspeed", zero_stage=1, **saved),
            job("native-from-native", **from_native),
            job("native-from-ds", init_from=_init(ds_src)),
            job("ds-from-native", engine="deepspeed", zero_stage=1, init_from=_init(native_src)),
            job("resumed", stop_at=1, **from_native),
            job("resumed", resume=True, **from_native)]
    launch(1, jobs, runs / "jobs")
    return runs


def _first_batch_loss(source: Path, spec) -> float:
    """The mean loss of the source checkpoint's weights on the batch the run draws at step 0, in this process."""
    from trainer.checkpoint.consolidated import checkpoint_state, empty_model
    from trainer.data import BatchSampler, load_tokens, prepare_dataset
    from trainer.model import loss_fn

    model = empty_model(read_manifest(source).model_spec())
    model.load_state_dict(checkpoint_state(source), strict=False)
    model.eval()
    data = prepare_dataset(spec.dataset, spec.model.vocab_size)
    sampler = BatchSampler(load_tokens(data.train_path), spec.model.seq_len, spec.plan.micro_batch,
                           spec.plan.grad_accum, seed=spec.seed)
    with torch.no_grad():
        return float(np.mean([float(loss_fn(model(torch.from_numpy(x)), torch.from_numpy(y)))
                              for x, y in sampler.micro_batches(0)]))


@pytest.mark.parametrize("name,source", [("native-from-native", "src-native"), ("native-from-ds", "src-ds"),
                                         ("ds-from-native", "src-native")])
def test_its_first_loss_is_the_source_weights_loss_on_that_batch(init_runs, dataset, name, source):
    folder = latest_checkpoint(init_runs / source)
    spec = tiny_spec(init_runs / name, dataset, STEPS, micro_batch=4 if name == "native-from-native" else 2)
    expected = _first_batch_loss(folder, spec)
    first = losses(init_runs / name)[0]
    assert abs(first - expected) / expected < 1e-5, (first, expected)
    # not the seeded initialisation's loss: the source trained for two steps
    assert abs(first - losses(init_runs / source)[0]) > 1e-3


def test_it_starts_at_step_zero_and_records_where_it_started(init_runs):
    run, source = init_runs / "native-from-native", latest_checkpoint(init_runs / "src-native")
    assert [r["step"] for r in records(run) if "loss" in r] == [1, 2]
    started = records(run, "events.jsonl")[0]
    assert started["event"] == "started" and started["step"] == 0
    assert started["started_from"] == str(source.resolve()) and started["resumed_from"] is None
    manifest = read_manifest(latest_checkpoint(run))
    assert manifest.started_from == str(source.resolve()) and manifest.step == STEPS
    assert manifest.tokens_seen == STEPS * 8 * 64  # counted from the run's own start, not the source's
    assert read_manifest(source).started_from is None


def test_resume_wins_over_init_from(init_runs):
    """Stopped at step 1 and resumed: the resume continues from its own checkpoint, the same curve as straight."""
    straight, resumed = losses(init_runs / "native-from-native"), losses(init_runs / "resumed")
    assert len(resumed) == STEPS and max(abs(a - b) / a for a, b in zip(straight, resumed)) < 1e-6
    kinds = [(e["event"], e.get("resumed_from"), e.get("started_from"))
             for e in records(init_runs / "resumed", "events.jsonl") if e["event"] == "started"]
    assert kinds[0][2] is not None and kinds[1][1].endswith("step-1") and kinds[1][2] is None


def test_it_tokenizes_with_the_checkpoints_tokenizer(init_runs, dataset):
    """The source's tokenizer is the dataset's own: the prepared folder is reused, and every checkpoint names it."""
    tokenizer = read_manifest(latest_checkpoint(init_runs / "src-native")).tokenizer
    assert read_manifest(latest_checkpoint(init_runs / "native-from-native")).tokenizer == tokenizer
    assert Path(tokenizer).parent == Path(dataset.prepared_dir)


def test_it_refuses_a_checkpoint_of_another_model_naming_the_fields(init_runs, dataset, tmp_path):
    from trainer.checkpoint.weights import InitFromError, source_manifest

    source = latest_checkpoint(init_runs / "src-native")
    spec = tiny_spec(tmp_path, dataset, STEPS)
    with pytest.raises(InitFromError, match=r"differs from the checkpoint's in d_model, n_heads \(d_model: "
                                            r"checkpoint 64, run 128"):
        source_manifest(source, spec.model.replace(d_model=128, n_heads=8))
    # training-only fields may differ
    assert source_manifest(source, spec.model.replace(dropout=0.1, name="mine")).step == STEPS
    with pytest.raises(InitFromError, match="no readable manifest.json"):
        source_manifest(tmp_path, spec.model)


def test_a_given_tokenizer_tokenizes_the_dataset_beside_the_trained_one(dataset, tmp_path):
    """keep_tokenizer with a tokenizer other than the dataset's: its own prepared folder, named by its bytes, ids as
    that tokenizer encodes the text, its end-of-text token named by its tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from trainer.data import load_tokens, prepare_dataset

    text = "the cat sat on the mat\n" * 400
    (tmp_path / "text.txt").write_text(text)
    vocab = {t: i for i, t in enumerate(["<unk>", "</s>", "the", "cat", "sat", "on", "mat"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    src = tmp_path / "ckpt"
    src.mkdir()
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    spec = dataset.replace(path=str(tmp_path / "text.txt"), prepared_dir="")
    data = prepare_dataset(spec, 512, tokenizer=src / "tokenizer.json")
    assert data.tokenizer_path.parent.name.startswith("tokenizer-") and data.vocab_size == 7
    assert data.meta["eos_id"] == 1 and data.meta["tokenizer_source"] == str((src / "tokenizer.json").resolve())
    assert list(load_tokens(data.train_path)[:6]) == [2, 3, 4, 5, 2, 6]
    trained = prepare_dataset(spec, 512)  # the dataset's own tokenizer, in its own folder, untouched
    assert trained.tokenizer_path.parent != data.tokenizer_path.parent and trained.vocab_size > 7
    assert prepare_dataset(spec, 512, tokenizer=src / "tokenizer.json").meta == data.meta  # reused as it is


def test_the_trainer_refuses_another_model_before_building_anything(init_runs, dataset, tmp_path):
    """Exit status 2, the differing fields on stderr and in the run folder's one failed event."""
    import subprocess

    from tests.trainer.launch import PYTHON, REPO, _env

    source = latest_checkpoint(init_runs / "src-native")
    spec = tiny_spec(tmp_path / "run", dataset, STEPS, layers=2, init_from=_init(source))
    (tmp_path / "spec.json").write_text(spec.to_json())
    done = subprocess.run([PYTHON, "-m", "trainer", "--spec", str(tmp_path / "spec.json")], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "differs from the checkpoint's in n_layers (n_layers: checkpoint 4, run 2)" in done.stderr
    [failed] = records(tmp_path / "run", "events.jsonl")
    assert failed["event"] == "failed" and failed["refused"] and "n_layers" in failed["error"]


@pytest.mark.parametrize("name", ["init-ds-pp2-from-zero3", "init-native-pp2-from-zero3"])
def test_a_pipeline_of_either_engine_starts_from_zero3_weights(engine_runs, dataset, name):
    """Two stages, the tied head on the last (DeepSpeed: its tied module), filled from DeepSpeed's ZeRO-3 files."""
    source = latest_checkpoint(engine_runs / "ds-zero3-consolidate")
    expected = _first_batch_loss(source, tiny_spec(engine_runs / name, dataset, 1, pp=2))
    [first] = losses(engine_runs / name)
    assert abs(first - expected) / expected < 1e-5, (first, expected)
    assert records(engine_runs / name, "events.jsonl")[0]["started_from"] == str(source.resolve())

"""The exporter: a checkpoint becomes a model-repository entry that stands on its own, reduced and split as asked,
with what the reduction cost measured; bad options are refused before anything is written."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from deploy.__main__ import main as deploy_main
from deploy.export import ExportError, ExportOptions, config_pbtxt, export
from trainer.contract.manifest import read_manifest


@pytest.fixture(scope="module")
def int8_tp2(shakespeare_checkpoint, tmp_path_factory):
    repository = tmp_path_factory.mktemp("repository")
    report = export(shakespeare_checkpoint, repository, ExportOptions(name="s8", reduction="int8", tensor_parallel=2))
    return repository, report


def test_it_writes_an_entry_that_stands_on_its_own(int8_tp2):
    repository, report = int8_tp2
    version = repository / "s8" / "1"
    names = {p.relative_to(repository / "s8").as_posix() for p in (repository / "s8").rglob("*") if p.is_file()}
    assert {"config.pbtxt", "1/model.py", "1/model_spec.json", "1/serving.json", "1/tokenizer.json",
            "1/weights/rank-0.safetensors", "1/weights/rank-1.safetensors",
            "1/workbench_serving/engine.py", "1/workbench_serving/model.py"} <= names
    assert json.loads((version / "serving.json").read_text()) == report
    assert not [p for p in repository.parent.iterdir() if p.name.startswith(".s8-")], "no staging folder left"


def test_it_measures_what_int8_costs(int8_tp2):
    _, report = int8_tp2
    assert report["ratio"] >= 3.5
    assert abs(report["perplexity_change"]) < 0.02 and report["perplexity"] < 100


def test_its_entry_generates_the_checkpoints_tokens_with_nothing_of_the_project(int8_tp2):
    """A fresh interpreter that sees only the version folder (-I: no PYTHONPATH, no current directory) serves the
    smoke prompt with rank 0 of 1 after resharding back: the exported rank files are complete shards."""
    repository, report = int8_tp2
    whole = repository.parent / "s8-whole"
    export(report["checkpoint"], whole, ExportOptions(name="s8", reduction="int8", measure=False))
    script = textwrap.dedent("""
        import json, pathlib, sys
        import torch
        sys.path.insert(0, sys.argv[1])
        from workbench_serving.engine import Engine, Request
        from workbench_serving.layout import Codec
        from workbench_serving.tensor_parallel import build_rank_model

        folder = pathlib.Path(sys.argv[1])
        model = build_rank_model(folder, 0, 1, 2, torch.device("cpu"), torch.float32)
        codec, out = Codec(folder / "tokenizer.json"), []

        class Sink:
            def on_token(self, text, token_id, logprob=None): pass
            def on_finish(self, result): out.append(result.token_ids)
            def on_error(self, message): out.append(message)
            def is_cancelled(self): return False

        engine = Engine(model, codec, model.spec.seq_len)
        engine.submit(Request(codec.encode(sys.argv[2]), Sink(), max_tokens=16))
        while engine.busy():
            engine.step()
        print(json.dumps(out[0]))
        print(sorted(k for k in sys.modules if k.split(".")[0] in ("trainer", "deploy", "webapp", "workers")))
    """)
    done = subprocess.run([sys.executable, "-I", "-c", script, str(whole / "s8" / "1"), report["smoke"]["prompt"]],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    tokens, modules = done.stdout.strip().splitlines()
    assert json.loads(tokens) == report["smoke"]["token_ids"] and modules == "[]"


def test_it_replaces_an_entry_in_one_move(shakespeare_checkpoint, tmp_path):
    export(shakespeare_checkpoint, tmp_path, ExportOptions(name="m", measure=False, streaming=False))
    assert "decoupled" not in (tmp_path / "m" / "config.pbtxt").read_text()
    export(shakespeare_checkpoint, tmp_path, ExportOptions(name="m", measure=False))
    assert "decoupled: true" in (tmp_path / "m" / "config.pbtxt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_it_writes_gpu_instances_each_on_its_own_gpus():
    text = config_pbtxt(ExportOptions(name="g", kind="gpu", instances=2, tensor_parallel=2))
    assert "KIND_GPU count: 1 gpus: [ 0 ]" in text and "KIND_GPU count: 1 gpus: [ 2 ]" in text
    assert 'key: "tensor_parallel" value: { string_value: "2" }' in text and "max_batch_size: 0" in text


def test_it_refuses_what_it_cannot_export_saying_what_to_change(shakespeare_checkpoint, tmp_path):
    with pytest.raises(ExportError, match="tensor_parallel=3 must divide n_heads=4"):
        export(shakespeare_checkpoint, tmp_path, ExportOptions(name="x", tensor_parallel=3))
    with pytest.raises(ExportError, match="reduction 'int4'"):
        export(shakespeare_checkpoint, tmp_path, ExportOptions(name="x", reduction="int4"))
    with pytest.raises(ExportError, match="not a complete checkpoint"):
        export(tmp_path, tmp_path, ExportOptions(name="x"))
    assert list(tmp_path.iterdir()) == []


def test_it_exports_from_the_command_line_printing_one_json_line(shakespeare_checkpoint, tmp_path, capsys):
    assert deploy_main(["export", "--checkpoint", str(shakespeare_checkpoint), "--repository", str(tmp_path),
                        "--name", "cli", "--reduction", "bf16", "--no-measure"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reduction"] == "bf16" and report["ratio"] == pytest.approx(2.0, rel=0.01)
    assert report["step"] == read_manifest(shakespeare_checkpoint).step
    assert deploy_main(["export", "--checkpoint", str(shakespeare_checkpoint), "--repository", str(tmp_path),
                        "--name", "bad name"]) == 2
    assert "use letters, digits" in capsys.readouterr().err

"""Each rank's timeline: the digest's compute / exposed communication / idle sets as spans from the first profiled
step's start, sub-pixel detail repacked with every total kept, and the micro-batch actions the trace names (or,
for Schedule1F1B, which names none, matched from its operators)."""
import json

import pytest

from tests.trainer.profiling.test_profiling import X, write_trace
from trainer.profiling.digest import summarize_trace
from trainer.profiling.timeline import main, repack, timeline, write_timelines


def A(name, ts, dur, tid=1):
    return X(name, ts, dur, tid=tid, cat="user_annotation")


def B(ts, dur):
    return X("autograd::engine::evaluate_function: MmBackward0", ts, dur)


def test_it_draws_the_digests_sets_from_the_first_steps_start_with_the_pipelines_labelled_actions(tmp_path):
    # A last stage (2 of an interleaved pipeline) over two steps of 100 µs from t = 1,000: it receives (exposed),
    # runs 2F0 and 2B0, receives again, runs 2F1; the second step only idles.
    events = [A("ProfilerStep#4", 1000, 100), A("ProfilerStep#5", 1100, 100),
              X("c10d::recv_", 1000, 10), A("gloo:recv", 1000, 10),
              A("PP:2F0", 1010, 20), X("aten::linear", 1010, 20),
              A("PP:2B0", 1030, 30), B(1030, 30),
              A("PP:2RECV_F1", 1060, 10), X("c10d::recv_", 1060, 10),
              A("PP:2F1", 1070, 20), X("aten::linear", 1070, 20)]
    trace = write_trace(tmp_path / "rank-1.trace.json.gz", events)
    t = timeline(trace, rank=1)
    assert t["steps"] == 2 and t["step_starts_ms"] == [0.0, 0.1] and t["wall_ms"] == 0.2
    # spans longer than a pixel (0.2 ms / 1,200) are drawn as they are
    assert t["spans"] == {"compute": [[0.01, 0.06], [0.07, 0.09]], "comm": [[0.0, 0.01], [0.06, 0.07]],
                          "idle": [[0.09, 0.2]]}
    digest = summarize_trace(trace)
    assert (t["compute_ms"], t["comm_exposed_ms"], t["idle_ms"]) == (digest["compute_ms"], digest["comm_exposed_ms"],
                                                                     digest["idle_ms"])
    assert t["labels"] == "annotations"
    assert [(a["label"], a["kind"], a["stage"], a["microbatch"], a["step"], a["start"], a["end"])
            for a in t["actions"]] == [("F0", "F", 2, 0, 0, 0.01, 0.03), ("B0", "B", 2, 0, 0, 0.03, 0.06),
                                       ("F1", "F", 2, 1, 0, 0.07, 0.09)]


def test_it_labels_gpipes_ranges_and_the_zero_bubble_kinds(tmp_path):
    events = [A("ProfilerStep#0", 0, 100), A("Forward 0", 0, 20), X("aten::mm", 0, 20),
              A("Backward 0", 20, 30), B(20, 30), A("PP:0I1", 50, 10), A("PP:0W1", 60, 10),
              A("PP:(0F2;1B0)OVERLAP_F_B", 70, 20), A("Optimizer.step#AdamW.step", 90, 10)]
    t = timeline(write_trace(tmp_path / "rank-0.trace.json.gz", events), rank=0)
    assert [(a["label"], a["kind"], a["stage"]) for a in t["actions"]] == [
        ("F0", "F", None), ("B0", "B", None), ("I1", "I", 0), ("W1", "W", 0), ("F2+B0", "FB", None)]


def one_f_one_b_step(start, extra_forward=False):
    """Stage 0 of 1F1B with two micro-batches, as Schedule1F1B leaves it (no ranges): batch preparation, F0 and a
    send, F1 and a send, a receive, B0, B1 behind a receive, gradient clipping and the optimizer."""
    t = start
    events = [A(f"ProfilerStep#{start}", t, 200), X("aten::cat", t, 5), X("aten::linear", t + 5, 15),
              X("aten::gelu", t + 20, 5), X("c10d::send", t + 25, 5),
              X("aten::linear", t + 30, 20), X("c10d::send", t + 50, 5), X("c10d::recv_", t + 55, 15),
              B(t + 70, 30), X("c10d::recv_", t + 100, 10), B(t + 110, 30),
              X("aten::linalg_vector_norm", t + 140, 10), A("Optimizer.step#AdamW.step", t + 150, 30),
              X("aten::_foreach_add_", t + 150, 30)]
    if extra_forward:
        events.append(X("aten::linear", t + 185, 10))
    return events


def test_it_matches_1f1b_forwards_and_backwards_from_operators_when_the_schedule_names_none(tmp_path):
    events = one_f_one_b_step(0) + one_f_one_b_step(200)
    t = timeline(write_trace(tmp_path / "rank-0.trace.json.gz", events), rank=0)
    assert t["labels"] == "operators" and t["labels_note"] == ""
    assert [(a["step"], a["label"], a["start"], a["end"]) for a in t["actions"]][:4] == [
        (0, "F0", 0.0, 0.025), (0, "F1", 0.03, 0.05), (0, "B0", 0.07, 0.1), (0, "B1", 0.11, 0.14)]
    assert [a["label"] for a in t["actions"] if a["step"] == 1] == ["F0", "F1", "B0", "B1"]

    # the micro-batch count a recorded schedule gives is held to; a step that does not match is not guessed
    (tmp_path / "schedule-rank-0.json").write_text(json.dumps(
        {"schedule": "1f1b", "pp": 2, "pp_rank": 0, "stages_per_rank": 1, "microbatches": 2, "order": {}}))
    t = timeline(write_trace(tmp_path / "rank-0.trace.json.gz", one_f_one_b_step(0, extra_forward=True)
                             + one_f_one_b_step(200)), rank=0)
    assert [(a["step"], a["stage"]) for a in t["actions"]] == [(1, 0)] * 4
    assert t["labels_note"] == "left unlabelled, step 0: 3 forward and 2 backward stretches for 2 micro-batches"


def test_it_repacks_detail_finer_than_a_pixel_and_keeps_every_total(tmp_path):
    # 4,000 operators of 3 µs with 2 µs gaps, and a 10 ms receive in the middle: more spans than pixels
    events = [A("ProfilerStep#0", 0, 30_000)]
    events += [X("aten::add", 5 * i, 3) for i in range(2_000)]
    events += [X("c10d::recv_", 10_000, 10_000)]
    events += [X("aten::add", 20_000 + 5 * i, 3) for i in range(2_000)]
    trace = write_trace(tmp_path / "rank-0.trace.json.gz", events)
    t = timeline(trace, rank=0)
    digest = summarize_trace(trace)
    drawn = {kind: sum(e - s for s, e in spans) for kind, spans in t["spans"].items()}
    assert drawn["compute"] == pytest.approx(digest["compute_ms"], abs=1e-3)
    assert drawn["comm"] == pytest.approx(digest["comm_exposed_ms"], abs=1e-3)
    assert drawn["idle"] == pytest.approx(digest["idle_ms"], abs=1e-3)
    assert t["resolution_ms"] == pytest.approx(0.025) and t["repacked"] > 0
    assert sum(len(spans) for spans in t["spans"].values()) <= 2 * 1200 < 8_000
    assert [10.0, 20.0] in t["spans"]["comm"]  # a span longer than a pixel stays where it was


def test_repacking_moves_nothing_across_a_gap_between_steps():
    kinds = {"compute": [(0, 1), (2, 3), (10, 11)], "idle": [(1, 2)], "comm": [(11, 12)]}
    spans, repacked = repack(kinds, resolution=5)
    assert spans == {"compute": [(0, 2), (10, 11)], "idle": [(2, 3)], "comm": [(11, 12)]}
    assert repacked == 2


def test_it_writes_the_timelines_a_profile_folder_lacks(tmp_path, capsys):
    step = A("ProfilerStep#0", 0, 100)
    write_trace(tmp_path / "rank-0.trace.json.gz", [step, X("aten::mm", 0, 60)])
    write_trace(tmp_path / "rank-1.trace.json.gz", [step, X("aten::mm", 0, 30)])
    assert [p.name for p in write_timelines(tmp_path)] == ["timeline-rank-0.json", "timeline-rank-1.json"]
    assert write_timelines(tmp_path) == []
    assert main([str(tmp_path), "--again"]) == 0 and "timeline-rank-1.json" in capsys.readouterr().out
    assert json.loads((tmp_path / "timeline-rank-1.json").read_text())["compute_ms"] == 0.03

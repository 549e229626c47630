"""The serving benchmark: AIPerf, the standard client, really runs against the workbench engine through Triton's
HTTP generate_stream and through the web app's /v1 (both started by the benchmark), beside transformers' generate in
process, with the planner's prediction from a probe model measured the same way, and the table's figures parse and
agree with each other; a level run several times shows its median run. The figures themselves are timings, measured
by running the benchmark, not asserted here; aiperf's start (about 12 s a run on two cores) keeps this to one level
and one run.
The first run on a machine installs aiperf in its own environment (a few minutes, once)."""
from __future__ import annotations

import json

import pytest

from bench.deploy.aiperf_client import DEFAULT_VENV, Measurement, aiperf_executable
from bench.deploy.predict import probe_streams
from bench.deploy.serving import FLOOR, Row, main, median_run, table

NEW_TOKENS = 8


@pytest.fixture(scope="session")
def aiperf():
    return aiperf_executable(DEFAULT_VENV)


def parse(text: str) -> list[dict[str, str]]:
    """The rows of the Markdown table in ``text``, as header → cell."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def test_the_client_measures_triton_and_v1_beside_the_floor_and_the_table_agrees(aiperf, served_checkpoint,
                                                                                  tmp_path, capsys):
    results = tmp_path / "rows.json"
    assert main(["--checkpoint", str(served_checkpoint), "--engines", "workbench", "--streams", "2",
                 "--new-tokens", str(NEW_TOKENS), "--requests-per-stream", "2", "--min-requests", "4",
                 "--repeats", "1", "--work-dir", str(tmp_path / "work"), "--json", str(results)]) == 0
    rows = parse(capsys.readouterr().out)
    by_path = {row["path"]: row for row in rows}
    written = {r["path"]: r for r in json.loads(results.read_text())}  # the same rows, unrounded
    assert sorted(by_path) == sorted(["workbench · Triton HTTP", "workbench · /v1", FLOOR])
    for path, row in by_path.items():
        assert row["streams"] == "2" and row["requests"] == "4" and row["errors"] == "0", row
        ttft, itl, rate = (float(row[k]) for k in ("time to first token (ms)", "inter-token latency (ms)",
                                                    "tokens/s"))
        # a client starved of the two cores may read a tiny model's few tokens in one go, so the mean gap between
        # them can round to 0.00 ms; it must still be there and not negative
        assert ttft > 0 and itl >= 0 and rate > 0, row
        # what the client counted: about the tokens asked (a stop token may end a request early; re-tokenizing the
        # text may split a token in two)
        assert 1 <= float(row["tokens/request"]) <= 1.5 * NEW_TOKENS, row
        # the ratio of the unrounded rates, printed to two decimals
        ratio = written[path]["tokens_per_s"] / written[FLOOR]["tokens_per_s"]
        assert float(row["× floor"]) == pytest.approx(ratio, abs=0.005 + 1e-9)
        assert row["× fewest streams"] == "1.00" and row["runs (tokens/s)"] == "–"
        if path == FLOOR:
            assert row["predicted tokens/s"] == row["error"] == "–"
        else:  # the planner's figure for this path, from the probe's host costs measured through the same path
            predicted, measured = written[path]["predicted"], written[path]["tokens_per_s"]
            assert predicted > 0 and float(row["predicted tokens/s"]) == pytest.approx(predicted, abs=0.5)
            assert float(row["error"].rstrip(" %")) == pytest.approx(100 * (predicted / measured - 1), abs=0.05)
    # aiperf's own export is where the figures came from; the probe was measured at one stream and at sixteen
    aiperf_runs = tmp_path / "work" / "aiperf"
    exported = json.loads((aiperf_runs / "workbench-Triton-HTTP-2" / "profile_export_aiperf.json").read_text())
    assert exported["request_count"]["avg"] == 4 and exported["inter_token_latency"]["avg"] >= 0
    for target in ("workbench-Triton-HTTP", "workbench-v1"):
        for streams in probe_streams([2]):
            assert (aiperf_runs / f"probe-{target}-{streams}" / "profile_export_aiperf.json").is_file()
    assert written["workbench · /v1"]["requests"] == 4 and written[FLOOR]["errors"] == 0


def test_the_table_compares_each_path_with_the_floor_and_with_its_own_fewest_streams():
    def m(streams, rate):
        return Measurement(streams=streams, requests=4, errors=0, ttft_ms=10.0, itl_ms=2.0, tokens_per_s=rate,
                           tokens_per_request=8.0)
    rows = parse(table([Row(FLOOR, m(1, 50)), Row(FLOOR, m(8, 100)), Row("engine", m(1, 100), predicted=110.0),
                        Row("engine", m(8, 600), predicted=540.0), Row("other", m(8, 300))]))
    got = [(r["streams"], r["path"], r["× floor"], r["× fewest streams"], r["predicted tokens/s"], r["error"])
           for r in rows]
    assert got == [("1", "engine", "2.00", "1.00", "110", "+10.0 %"), ("1", FLOOR, "1.00", "1.00", "–", "–"),
                   ("8", "engine", "6.00", "6.00", "540", "-10.0 %"), ("8", "other", "3.00", "1.00", "–", "–"),
                   ("8", FLOOR, "1.00", "2.00", "–", "–")]


def test_a_level_run_several_times_shows_its_median_run_and_every_runs_tokens_per_s():
    def run(rate, ttft):
        return Row("engine", Measurement(streams=8, requests=32, errors=0, ttft_ms=ttft, itl_ms=2.0,
                                         tokens_per_s=rate, tokens_per_request=8.0), load=1.0, predicted=500.0)
    median = median_run([run(620, 30.0), run(480, 50.0), run(550, 40.0)])
    assert (median.measurement.tokens_per_s, median.measurement.ttft_ms) == (550, 40.0)  # one run's figures, whole
    assert median.runs == (480, 550, 620) and median.predicted == 500.0
    assert median_run([run(620, 30.0), run(480, 50.0)]).measurement.tokens_per_s == 480  # the lower middle
    row = parse(table([median]))[0]
    assert (row["tokens/s"], row["runs (tokens/s)"], row["error"]) == ("550", "480 · 550 · 620", "-9.1 %")

"""The serving scheduler without a model: what each plan admits, prefills, decodes, restarts and saves, and what the
requests receive from the tokens drawn (here, chosen by the test)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from deploy.serving.request import Request, Result, Sampling
from deploy.serving.scheduler import Admission, Batch, BlockSave, Output, Plan, Scheduler


class Sink:
    def __init__(self):
        self.tokens: list[tuple[str, int]] = []
        self.result: Result | None = None
        self.error: str | None = None
        self.cancelled = False

    def on_token(self, text, token_id, logprob=None):
        self.tokens.append((text, token_id))

    def on_finish(self, result):
        self.result = result

    def on_error(self, message):
        self.error = message

    def is_cancelled(self):
        return self.cancelled


class Letters:
    """Token id → one letter; 99 ends the text."""

    eos_id = 99

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


def _scheduler(slots=4, seq_len=64, prefill_chunk=512, prefix_blocks=0, block_size=4) -> Scheduler:
    return Scheduler(slots, seq_len, Letters(), prefill_chunk=prefill_chunk, prefix_blocks=prefix_blocks,
                     block_size=block_size)


def _submit(scheduler: Scheduler, prompt: list[int], **kw) -> Sink:
    sink = Sink()
    scheduler.add(Request(prompt, sink, **kw))
    return sink


def _step(scheduler: Scheduler, token=lambda slot: slot + 1) -> Plan:
    """One iteration with ``token(slot)`` as each drawn token. (A one-token prompt runs in the decode step, as a
    sequence's last token does; a longer one in a prefill.)"""
    plan = scheduler.schedule()
    drawn = {batch.slots[row]: token(batch.slots[row]) for batch in plan.batches for row in batch.draws}
    scheduler.update(plan, Output(drawn))
    return plan


def test_it_admits_in_arrival_order_into_the_lowest_free_slots_and_prefills_within_the_budget():
    scheduler = _scheduler(slots=2, prefill_chunk=7)
    _submit(scheduler, [1, 2, 3, 4, 5])
    _submit(scheduler, [6, 7, 8, 9, 10, 11], sampling=Sampling(temperature=0.5, seed=3))
    _submit(scheduler, [12])
    plan = _step(scheduler)
    assert plan.admissions == [Admission(0, []), Admission(1, [], Sampling(temperature=0.5, seed=3))]
    # the first's 5 tokens and 2 of the second's: under half as long, in a batch of its own; only the first ends
    assert plan.prefills == [Batch([0], [[1, 2, 3, 4, 5]], [0]), Batch([1], [[6, 7]], [])]
    assert plan.decode is None and plan.restarts == [] and plan.saves == []
    plan = _step(scheduler)
    assert plan.admissions == []  # the third waits for a slot
    assert plan.prefills == [Batch([1], [[8, 9, 10, 11]], [0])] and plan.decode == Batch([0], [[1]], [0])


def test_it_batches_chunks_of_similar_length_each_batch_in_slot_order():
    scheduler = _scheduler(prefill_chunk=100)
    for prompt in ([1] * 5, [2] * 40, [3] * 4, [4] * 30):
        _submit(scheduler, prompt)
    plan = _step(scheduler)
    assert [(b.slots, [len(c) for c in b.chunks]) for b in plan.prefills] == [([1, 3], [40, 30]), ([0, 2], [5, 4])]


def test_a_long_prompt_is_chunked_over_iterations_beside_the_decode_step():
    scheduler = _scheduler(prefill_chunk=8)
    _submit(scheduler, [1, 2], max_tokens=20)
    _step(scheduler)
    long = _submit(scheduler, list(range(1, 21)), stream=True)
    chunks = []
    while not long.tokens:
        plan = _step(scheduler)
        assert plan.decode == Batch([0], [[1]], [0])  # the running sequence decodes every iteration
        chunks.append((plan.prefills[0].chunks[0], plan.prefills[0].draws))
    assert chunks == [(list(range(1, 9)), []), (list(range(9, 17)), []), (list(range(17, 21)), [0])]


def test_a_prompt_starts_from_the_prefix_blocks_another_saved():
    scheduler = _scheduler(prefix_blocks=8, block_size=4)
    template = [10, 11, 12, 13, 14, 15, 16, 17, 18]
    _submit(scheduler, template + [20], max_tokens=1)
    plan = _step(scheduler)
    assert plan.saves == [BlockSave(0, 0, [0, 1])]  # its two whole blocks, copied once the prompt is computed
    _submit(scheduler, template + [30, 31, 32], max_tokens=1)
    plan = _step(scheduler)
    assert plan.admissions == [Admission(0, [0, 1])]  # the slot the first left, with the blocks copied in
    assert plan.prefills == [Batch([0], [[18, 30, 31, 32]], [0])]  # only what follows them is computed
    assert plan.saves == [BlockSave(0, 2, [2])]  # its third block is new
    assert (scheduler.metrics.prefix_lookups, scheduler.metrics.prefix_hits,
            scheduler.metrics.prefix_hit_tokens) == (2, 1, 8)


def test_a_prompt_to_score_is_computed_whole_each_chunk_against_the_tokens_after_it():
    scheduler = _scheduler(prefill_chunk=4, prefix_blocks=8, block_size=4)
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 18]
    _submit(scheduler, prompt, max_tokens=1)
    while scheduler.has_work():
        _step(scheduler)  # the prompt's two whole blocks are in the prefix cache now
    _submit(scheduler, prompt, max_tokens=1, sampling=Sampling(prompt_logprobs=0))
    plans = [_step(scheduler) for _ in range(3)]
    assert plans[0].admissions == [Admission(0, [], Sampling(prompt_logprobs=0))]  # no blocks: every position
    assert [p.prefills for p in plans[:2]] == [[Batch([0], [[10, 11, 12, 13]], [], [0], [[11, 12, 13, 14]])],
                                               [Batch([0], [[14, 15, 16, 17]], [], [0], [[15, 16, 17, 18]])]]
    assert plans[2].decode == Batch([0], [[18]], [0])  # the prompt's last token: the drawn one follows it


def test_decode_steps_take_every_running_sequence_in_slot_order_with_its_last_token():
    scheduler = _scheduler()
    for prompt in ([1], [2, 3], [4]):
        _submit(scheduler, prompt, max_tokens=5)
    _step(scheduler, token=lambda slot: 40 + slot)
    plan = _step(scheduler, token=lambda slot: 50 + slot)
    assert plan.prefills == [] and plan.decode == Batch([0, 1, 2], [[40], [41], [42]], [0, 1, 2])
    assert _step(scheduler).decode.chunks == [[50], [51], [52]]


def test_a_full_window_restarts_over_its_last_seq_len_minus_one_tokens():
    scheduler = _scheduler(seq_len=8)
    sink = _submit(scheduler, [1, 2, 3, 4, 5], max_tokens=10)
    tokens = iter(range(30, 40))
    plans = [_step(scheduler, token=lambda slot: next(tokens)) for _ in range(5)]
    # 5 prompt positions, then 3 decode steps fill the 8; the next iteration starts the slot over
    assert [p.restarts for p in plans] == [[], [], [], [], [0]]
    assert plans[4].prefills == [Batch([0], [[3, 4, 5, 30, 31, 32, 33]], [0])] and plans[4].decode is None
    assert plans[3].decode == Batch([0], [[32]], [0])
    _step(scheduler, token=lambda slot: next(tokens))
    assert sink.result is None
    while sink.result is None:
        _step(scheduler, token=lambda slot: next(tokens))
    assert sink.result.token_ids == list(range(30, 40))


@pytest.mark.parametrize("rule, kw, expected", [
    ("the end-of-text token", dict(), ("stop", "BCD", [1, 2, 3, 99])),
    ("a stop string", dict(stop=("CD",)), ("stop", "B", [1, 2, 3])),
    ("max_tokens", dict(max_tokens=2), ("length", "BC", [1, 2])),
])
def test_a_sequence_stops_and_frees_its_slot(rule, kw, expected):
    scheduler = _scheduler(slots=1)
    sink = _submit(scheduler, [7], **{"max_tokens": 10, **kw})
    waiting = _submit(scheduler, [8], max_tokens=1)
    tokens = iter([1, 2, 3, 99, 5])
    while sink.result is None:
        _step(scheduler, token=lambda slot: next(tokens))
    assert (sink.result.finish_reason, sink.result.text, sink.result.token_ids) == expected
    plan = _step(scheduler)
    assert plan.admissions == [Admission(0, [])] and waiting.result.completion_tokens == 1


def test_a_cancelled_request_finishes_at_the_next_schedule_and_a_waiting_one_takes_its_slot_at_once():
    scheduler = _scheduler(slots=1)
    cancelled = _submit(scheduler, [7], max_tokens=10, stream=True)
    waiting = _submit(scheduler, [8, 9], max_tokens=2)
    _step(scheduler)
    _step(scheduler)
    cancelled.cancelled = True
    plan = _step(scheduler)
    assert cancelled.result.finish_reason == "cancelled" and cancelled.result.completion_tokens == 2
    assert plan.admissions == [Admission(0, [])] and plan.prefills == [Batch([0], [[8, 9]], [0])]
    assert plan.decode is None  # no step for the cancelled one
    assert _step(scheduler).decode == Batch([0], [[1]], [0]) and waiting.result.completion_tokens == 2


def test_a_cancelled_waiting_request_is_never_admitted():
    scheduler = _scheduler()
    sink = _submit(scheduler, [1, 2])
    sink.cancelled = True
    plan = _step(scheduler)
    assert not plan and sink.result.finish_reason == "cancelled" and not scheduler.has_work()


def test_it_streams_each_token_in_order_holding_back_a_possible_stop_string():
    scheduler = _scheduler()
    sink = _submit(scheduler, [7], max_tokens=6, stop=("EX",), stream=True)
    tokens = iter([1, 2, 4, 3, 4, 5])  # B C E D E F: "E" is held until the next letter shows it is no stop
    while sink.result is None:
        _step(scheduler, token=lambda slot: next(tokens))
    assert sink.tokens == [("B", 1), ("C", 2), ("", 4), ("ED", 3), ("", 4), ("EF", 5)]
    assert sink.result.text == "BCEDEF" and sink.result.unsent == "" and sink.result.finish_reason == "length"


def test_tokens_go_out_in_the_plans_order_prefills_first():
    scheduler = _scheduler()
    order = []
    for prompt in ([1, 1], [2, 3]):
        sink = _submit(scheduler, prompt, max_tokens=3, stream=True)
        sink.on_token = lambda text, token_id, logprob, p=prompt[0]: order.append(p)
    _step(scheduler)
    late = _submit(scheduler, [4, 4], max_tokens=3, stream=True)
    late.on_token = lambda text, token_id, logprob: order.append(4)
    _step(scheduler)
    assert order == [1, 2, 4, 1, 2]  # the new prompt's first token, then the decode step's


def test_a_bad_request_is_refused_with_the_reason():
    scheduler = _scheduler()
    sink = _submit(scheduler, [], max_tokens=0)
    assert "prompt is empty" in sink.error and "max_tokens=0" in sink.error and not scheduler.has_work()


def test_failing_all_ends_every_request_and_empties_the_prefix_cache():
    scheduler = _scheduler(slots=1, prefix_blocks=4)
    running, waiting = _submit(scheduler, [1, 2, 3, 4, 5]), _submit(scheduler, [6])
    scheduler.schedule()  # entered the prompt's block: the plan that would copy it never runs
    scheduler.fail_all("generation failed")
    assert running.error == waiting.error == "generation failed" and not scheduler.has_work()
    assert len(scheduler.prefix) == 0
    again = _submit(scheduler, [1, 2, 3, 4, 5])
    assert scheduler.schedule().admissions == [Admission(0, [])] and again.error is None


def test_a_plan_survives_its_broadcast_as_ints():
    scheduler = _scheduler(prefill_chunk=6, prefix_blocks=4, block_size=2)
    _submit(scheduler, [1, 2, 3], max_tokens=4)
    _step(scheduler)
    _submit(scheduler, [1, 2, 5, 6, 7, 8, 9, 10])
    _submit(scheduler, [11, 12])
    plan = scheduler.schedule()
    assert plan.admissions and plan.prefills and plan.decode and plan.saves
    assert Plan.from_ints(plan.to_ints()) == plan
    assert Plan.from_ints(Plan().to_ints()) == Plan()


def test_it_imports_no_torch():
    code = "import sys, deploy.serving.scheduler; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

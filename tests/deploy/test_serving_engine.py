"""The serving model and its engine, in this process: the trainer's tokens, batched, streamed, stopped, cancelled;
for every family of model (GPT-2, Llama, Mixtral, Qwen2-MoE), whole and reduced; prompts prefilled together, in
chunks, and from the prefix cache give the tokens of one prompt at a time."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from deploy.quality import model_with
from deploy.reduce import REDUCTIONS, dequantize_state, reduce_state
from deploy.serving.engine import Engine, Request, Result
from deploy.serving.model import ServingGPT, ServingSpec, inverse_frequencies
from deploy.serving.prefix_cache import PrefixCache
from deploy.serving.sampling import Sampling
from trainer.contract.presets import MODELS
from trainer.generate import generate
from trainer.model import build_model
from trainer.model.gpt import rotary_frequencies
from trainer.model.moe import moe_layers

FAMILIES = ("tiny-llama", "tiny-mixtral", "tiny-qwen-moe")


class ListSink:
    """Collects one request's answer; cancelled after ``cancel_after`` tokens if given."""

    def __init__(self, cancel_after: int | None = None):
        self.tokens: list[tuple[str, int, object]] = []
        self.result: Result | None = None
        self.error: str | None = None
        self.cancel_after = cancel_after
        self.done = threading.Event()

    def on_token(self, text, token_id, logprob=None):
        self.tokens.append((text, token_id, logprob))

    def on_finish(self, result):
        self.result = result
        self.done.set()

    def on_error(self, message):
        self.error = message
        self.done.set()

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.tokens) >= self.cancel_after


class ByteCodec:
    """Token id → one character: enough to check text, stop strings and streaming against ids."""

    eos_id = None

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


def _engine(kw=None, slots=4, reduction="none", prefill_chunk=256, prefix_blocks=0, block_size=4, codec=None):
    spec = MODELS["tiny"].replace(**(kw or {}))
    model = build_model(spec, 3).eval()
    serving = ServingGPT(ServingSpec.from_dict(spec.to_dict()), reduce_state(model.state_dict(), reduction), slots,
                         prefix_blocks=prefix_blocks, block_size=block_size)
    return model, Engine(serving, codec or ByteCodec(), spec.seq_len, prefill_chunk=prefill_chunk)


def _drain(engine):
    while engine.busy():
        engine.step()


@pytest.mark.parametrize("kw", [{}, dict(positions="rope", n_kv_heads=2, tied_embeddings=False),
                                dict(n_experts=4, top_k=2, capacity_factor=8.0)])
def test_it_gives_the_trainers_greedy_tokens_for_sequences_decoded_together(kw):
    model, engine = _engine(kw)
    prompts = [[5, 6, 7], [1, 2, 3, 4, 9, 10], [42], [7] * 20]
    sinks = [ListSink() for _ in prompts]
    for prompt, sink in zip(prompts, sinks):
        engine.submit(Request(prompt, sink, max_tokens=24))
    _drain(engine)
    for prompt, sink in zip(prompts, sinks):
        assert sink.result.token_ids == generate(model, prompt, 24, temperature=0)[len(prompt):]
        assert sink.result.finish_reason == "length" and sink.result.completion_tokens == 24
    assert max(engine.metrics.batch_sizes) == 4  # every sequence in one decode step


def test_it_slides_past_the_context_window_as_the_trainer_does():
    model, engine = _engine(dict(seq_len=16))
    sink = ListSink()
    engine.submit(Request(list(range(10)), sink, max_tokens=40))
    _drain(engine)
    assert sink.result.token_ids == generate(model, list(range(10)), 40, temperature=0)[10:]


@pytest.mark.parametrize("prefill_chunk", [256, 1])  # 1: a draw only where a prompt is complete
def test_it_samples_the_trainers_tokens_from_a_seed(prefill_chunk):
    model, engine = _engine(prefill_chunk=prefill_chunk)
    sampling = Sampling(temperature=0.9, top_k=40, top_p=0.9, seed=11)
    sinks = [ListSink(), ListSink()]
    engine.submit(Request([1, 2], sinks[0], max_tokens=20, sampling=sampling))
    engine.submit(Request([3, 4, 5], sinks[1], max_tokens=20, sampling=sampling))  # decoded beside the first
    _drain(engine)
    assert sinks[0].result.token_ids == generate(model, [1, 2], 20, temperature=0.9, top_k=40, top_p=0.9,
                                                 seed=11)[2:]


def test_it_lets_new_requests_join_between_decode_steps():
    _, engine = _engine()
    first, second = ListSink(), ListSink()
    engine.submit(Request([1, 2, 3], first, max_tokens=30))
    for _ in range(5):
        engine.step()
    engine.submit(Request([4, 5], second, max_tokens=10))
    engine.step()  # the second is prefilled (its first token) beside the first's decode step …
    assert engine.metrics.prefills[-1] == (1, 2) and len(engine.metrics.first_tokens) == 2
    assert engine.metrics.batch_sizes[-1] == 1
    engine.step()  # … and decoded with it from the next
    assert engine.metrics.batch_sizes[-1] == 2 and first.result is None  # joined while the first is running
    _drain(engine)
    assert first.result.completion_tokens == 30 and second.result.completion_tokens == 10


def test_it_streams_one_token_at_a_time_and_the_pieces_make_the_text():
    _, engine = _engine()
    sink = ListSink()
    engine.submit(Request([1, 2, 3], sink, max_tokens=12, stream=True))
    _drain(engine)
    assert len(sink.tokens) == 12 and [t for _, t, _ in sink.tokens] == sink.result.token_ids
    assert "".join(text for text, _, _ in sink.tokens) + sink.result.unsent == sink.result.text


def test_it_stops_at_a_stop_string_and_never_streams_past_it():
    _, probe = _engine()
    sink = ListSink()
    probe.submit(Request([1, 2, 3], sink, max_tokens=12))
    _drain(probe)
    full = sink.result.text
    stop = full[5:7]  # two characters the model will produce
    _, engine = _engine()
    streamed = ListSink()
    engine.submit(Request([1, 2, 3], streamed, max_tokens=12, stop=(stop,), stream=True))
    _drain(engine)
    expected = full[:full.find(stop)]
    assert streamed.result.finish_reason == "stop" and streamed.result.text == expected
    assert "".join(text for text, _, _ in streamed.tokens) + streamed.result.unsent == expected


def test_it_stops_a_cancelled_request_within_one_decode_step():
    _, engine = _engine()
    cancelled, other = ListSink(cancel_after=3), ListSink()
    engine.submit(Request([1, 2, 3], cancelled, max_tokens=50, stream=True))
    engine.submit(Request([4, 5, 6], other, max_tokens=50))
    _drain(engine)
    assert cancelled.result.finish_reason == "cancelled" and cancelled.result.completion_tokens == 3
    assert other.result.completion_tokens == 50  # the others go on


def test_it_waits_for_a_free_slot_when_all_are_taken():
    _, engine = _engine(slots=2)
    sinks = [ListSink() for _ in range(5)]
    for i, sink in enumerate(sinks):
        engine.submit(Request([i + 1], sink, max_tokens=8))
    _drain(engine)
    assert all(s.result.completion_tokens == 8 for s in sinks) and max(engine.metrics.batch_sizes) == 2


def test_it_refuses_a_bad_request_with_the_reason():
    _, engine = _engine()
    sink = ListSink()
    engine.submit(Request([], sink, max_tokens=0))
    assert "prompt is empty" in sink.error and "max_tokens=0" in sink.error and not engine.busy()


def test_it_serves_from_its_own_thread():
    _, engine = _engine()
    engine.start()
    try:
        sinks = [ListSink() for _ in range(3)]
        for i, sink in enumerate(sinks):
            engine.submit(Request([i + 1, 2], sink, max_tokens=10))
        assert all(s.done.wait(30) for s in sinks)
        assert all(s.result.completion_tokens == 10 for s in sinks)
    finally:
        engine.stop()


def test_it_serves_int8_weights_as_their_dequantized_model():
    from deploy.quality import model_with
    from deploy.reduce import dequantize_state

    spec = MODELS["tiny"]
    model = build_model(spec, 3).eval()
    reduced = reduce_state(model.state_dict(), "int8")
    engine = Engine(ServingGPT(ServingSpec.from_dict(spec.to_dict()), reduced, 2), ByteCodec(), spec.seq_len)
    sink = ListSink()
    engine.submit(Request([5, 6, 7], sink, max_tokens=20))
    _drain(engine)
    reference = model_with(dequantize_state(reduced), spec)
    assert sink.result.token_ids == generate(reference, [5, 6, 7], 20, temperature=0)[3:]



def _alone(engine: Engine, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of ``prompt`` served by itself: one prefill, then decode steps of one sequence."""
    sink = ListSink()
    engine.submit(Request(prompt, sink, max_tokens=n))
    _drain(engine)
    return sink.result.token_ids


MIXED_PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [1, 2, 3, 4, 9, 10, 12, 13, 14, 15, 16, 17], [42, 41, 40, 39, 38, 37, 36],
                 [7, 100, 3, 250] * 3 + [9]]


@pytest.mark.parametrize("kw", [{}, dict(positions="rope", n_kv_heads=2, tied_embeddings=False),
                                dict(n_experts=4, top_k=2, capacity_factor=8.0)])
def test_it_prefills_prompts_of_mixed_lengths_together_with_the_tokens_of_each_alone(kw):
    model, engine = _engine(kw)
    served = _greedy_together(engine, MIXED_PROMPTS, 20)
    assert engine.metrics.prefills[0] == (4, sum(map(len, MIXED_PROMPTS)))  # one padded batch of the 4 prompts
    _, single = _engine(kw, slots=1)
    assert served == [_alone(single, p, 20) for p in MIXED_PROMPTS]
    assert all(sequences == 1 for sequences, _ in single.metrics.prefills)
    assert served == [generate(model, p, 20, temperature=0)[len(p):] for p in MIXED_PROMPTS]


def test_it_batches_prompts_of_similar_length_and_splits_the_rest():
    _, engine = _engine()
    _greedy_together(engine, [[1] * 40, [2] * 30, [3] * 5, [4] * 4], 4)
    assert engine.metrics.prefills[:2] == [(2, 70), (2, 9)]  # padding at most doubles a batch's work


@pytest.mark.parametrize("kw", [{}, dict(positions="rope", n_kv_heads=2)])
def test_a_long_prompt_is_prefilled_in_chunks_while_running_streams_keep_decoding(kw):
    model, engine = _engine(kw, prefill_chunk=8)
    running, long = ListSink(), ListSink()
    engine.submit(Request([1, 2, 3], running, max_tokens=30, stream=True))
    engine.step()
    prompt = [(7 * i) % 200 + 1 for i in range(45)]
    engine.submit(Request(prompt, long, max_tokens=20, stream=True))
    streamed_before = len(running.tokens)
    while not long.tokens:
        engine.step()
    assert len(running.tokens) - streamed_before >= 5  # a decode step each iteration of the 6 chunks
    assert [tokens for _, tokens in engine.metrics.prefills[1:]] == [8, 8, 8, 8, 8, 5]
    _drain(engine)
    _, unchunked = _engine(kw)
    assert long.result.token_ids == _alone(unchunked, prompt, 20) == generate(model, prompt, 20, temperature=0)[45:]
    assert running.result.token_ids == generate(model, [1, 2, 3], 30, temperature=0)[3:]


def test_several_prompts_share_one_iterations_chunk_in_arrival_order():
    _, engine = _engine(prefill_chunk=16)
    _greedy_together(engine, [[1] * 10, [2] * 10, [3] * 10], 3)
    # the first's 10 and the second's 6; then the third's 10, and the second's last 4 apart (under half as long)
    assert engine.metrics.prefills[:3] == [(2, 16), (1, 10), (1, 4)]


TEMPLATE = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]  # a playground template: 3 blocks of 4 and 2


@pytest.mark.parametrize("kw", [{}, dict(positions="rope", n_kv_heads=2, tied_embeddings=False)])
def test_a_prefix_cache_hit_gives_the_same_tokens_and_is_counted(kw):
    model, engine = _engine(kw, prefix_blocks=16, block_size=4)
    first, second = TEMPLATE + [30, 31], TEMPLATE + [40, 41, 42]
    assert _alone(engine, first, 16) == generate(model, first, 16, temperature=0)[len(first):]
    assert (engine.metrics.prefix_lookups, engine.metrics.prefix_hits) == (1, 0)
    assert _alone(engine, second, 16) == generate(model, second, 16, temperature=0)[len(second):]
    assert (engine.metrics.prefix_lookups, engine.metrics.prefix_hits, engine.metrics.prefix_hit_tokens) == (2, 1, 12)
    assert engine.metrics.prefills[-1] == (1, 5)  # only what follows the cached blocks is computed
    assert _alone(engine, first, 16) == generate(model, first, 16, temperature=0)[len(first):]
    assert engine.metrics.prefix_hit_tokens == 24 and engine.metrics.prefills[-1] == (1, 4)


def test_a_whole_cached_prompt_still_computes_its_last_token():
    model, engine = _engine(prefix_blocks=8, block_size=4)
    prompt = TEMPLATE[:12]  # exactly 3 blocks
    assert _alone(engine, prompt, 10) == _alone(engine, prompt, 10) == generate(model, prompt, 10, temperature=0)[12:]
    assert engine.metrics.prefix_hit_tokens == 8  # 2 blocks: the third holds the last token, whose logits are needed


def test_the_prefix_cache_is_bounded_and_evicts_the_least_recently_used_leaf_first():
    cache = PrefixCache(blocks=4, block_size=2)
    a, b, c = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]
    assert cache.add(a) == [(0, 0), (1, 1), (2, 2)]
    assert cache.match(a + [0]) == [0, 1, 2] and cache.add(a) == []  # cached already: nothing to copy
    assert cache.add(b) == [(0, 3), (1, 2)]  # full: a's last block (its leaf, least recently used) is taken
    assert len(cache) == 4 and cache.match(a + [0]) == [0, 1] and cache.match(b + [0]) == [3, 2]
    assert cache.add(c) == [(0, 1), (1, 0)]  # a's blocks were used before b's: a goes
    assert len(cache) == 4 and cache.match(a + [0]) == [] and cache.match(b + [0]) == [3, 2]
    assert cache.add(a) == [(0, 0), (1, 1), (2, 2)]  # a comes back: c's blocks, leaf first, then b's leaf go
    assert len(cache) == 4 and cache.match(b + [0]) == [3]


def test_an_engine_with_a_small_prefix_cache_evicts_and_stays_exact():
    model, engine = _engine(prefix_blocks=3, block_size=4)
    prompts = [TEMPLATE + [30], TEMPLATE[:8] + [50, 51, 52, 53, 54], [60, 61, 62, 63, 64, 65, 66, 67, 68],
               TEMPLATE + [31], TEMPLATE[:8] + [50, 51, 52, 53, 55]]
    for prompt in prompts:
        assert _alone(engine, prompt, 12) == generate(model, prompt, 12, temperature=0)[len(prompt):]
    assert len(engine.prefix) == 3 and engine.metrics.prefix_hits >= 1


def family_model(name: str, **kw):
    """The preset's model with every bias and norm gain moved off its initial 0 or 1, so that a bias or gain
    served in the wrong place (or not at all) changes the tokens."""
    spec = MODELS[name].replace(**kw)
    model = build_model(spec, 3).eval()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return spec, model


def _greedy_together(engine: Engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    sinks = [ListSink() for _ in prompts]
    for prompt, sink in zip(prompts, sinks):
        engine.submit(Request(prompt, sink, max_tokens=n))
    _drain(engine)
    return [sink.result.token_ids for sink in sinks]


# the last prompt passes the 64-token window: the slot is filled again over a 63-token prompt (MoE: 63 tokens routed
# at once, where a capacity would bite)
FAMILY_PROMPTS = [[5, 6, 7], [1, 2, 3, 4, 9, 10], [42], [7, 100, 3, 250] * 5]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_it_gives_the_trainers_greedy_tokens_for_every_family(family, reduction):
    """RMSNorm, SwiGLU, rotary base and Llama 3.1 scaling, GQA, q/k/v biases, routed experts renormalised or not,
    a gated shared expert: served from the reduced weights, the tokens of the trainer's model of the same weights
    (dequantised), for sequences decoded together."""
    spec, model = family_model(family)
    reduced = reduce_state(model.state_dict(), reduction)
    reference = model_with(dequantize_state(reduced), spec) if reduction != "none" else model
    engine = Engine(ServingGPT(ServingSpec.from_dict(spec.to_dict()), reduced, 4), ByteCodec(), spec.seq_len)
    served = _greedy_together(engine, FAMILY_PROMPTS, 48)
    assert served == [generate(reference, p, 48, temperature=0)[len(p):] for p in FAMILY_PROMPTS]
    assert max(engine.metrics.batch_sizes) == 4


@pytest.mark.parametrize("family", FAMILIES)
def test_it_rotates_with_the_trainers_frequencies(family):
    spec = MODELS[family]
    scaling = spec.rope_scaling.to_dict() if spec.rope_scaling else None
    assert torch.equal(inverse_frequencies(spec.head_dim, spec.rope_base, scaling),
                       rotary_frequencies(spec.head_dim, spec.rope_base, spec.rope_scaling))
    if spec.rope_scaling:  # the scaling changes the frequencies (of a 16-wide head, with a 32-position original)
        assert not torch.equal(inverse_frequencies(spec.head_dim, spec.rope_base, None),
                               inverse_frequencies(spec.head_dim, spec.rope_base, scaling))


def test_it_serves_the_first_dense_layers_dense():
    spec, model = family_model("tiny-mixtral", first_dense_layers=1, moe_every=1)
    serving = ServingGPT(ServingSpec.from_dict(spec.to_dict()), model.state_dict(), 2)
    assert [type(layer["mlp"]).__name__ for layer in serving.layers] == ["MLP", "MoE", "MoE", "MoE"]
    engine = Engine(serving, ByteCodec(), spec.seq_len)
    assert _greedy_together(engine, [[5, 6, 7]], 24) == [generate(model, [5, 6, 7], 24, temperature=0)[3:]]


def test_the_trainers_reference_drops_no_token_when_the_capacity_factor_is_0():
    """A capacity_factor 0 model (the presets of Mixtral and Qwen2-MoE) computes every chosen expert in the trainer
    too, a whole window at once: so the trainer's tokens are what serving, which never drops, must give."""
    for family in ("tiny-mixtral", "tiny-qwen-moe"):
        spec, model = family_model(family)
        with torch.no_grad():
            model(torch.arange(spec.seq_len).unsqueeze(0) * 7 % spec.vocab_size)
        assert [int(m.stats.dropped) for m in moe_layers([model])] == [0] * len(spec.moe_layers)


def test_it_computes_every_chosen_expert_of_a_model_trained_with_a_capacity():
    """A model trained with a capacity (1.0 here) is served without it: its tokens are those of the trainer's model
    of the same weights with capacity_factor 0. The trainer's own generation drops choices past the capacity in a
    prefill of many tokens (one token at a time never fills an expert), so there the two may differ."""
    spec, model = family_model("tiny-mixtral", capacity_factor=1.0)
    prompt = [7, 100, 3, 250, 11, 60] * 8
    with torch.no_grad():
        model(torch.tensor([prompt]))
    assert sum(int(m.stats.dropped) for m in moe_layers([model])) > 0  # the trainer drops in this prefill
    engine = Engine(ServingGPT(ServingSpec.from_dict(spec.to_dict()), model.state_dict(), 2), ByteCodec(),
                    spec.seq_len)
    unlimited = model_with(model.state_dict(), spec.replace(capacity_factor=0.0))
    assert _greedy_together(engine, [prompt], 24) == [generate(unlimited, prompt, 24, temperature=0)[len(prompt):]]


def _trainer_logprobs(model, sequence):
    """The trainer model's log-probability of each token of ``sequence`` after the first, and each position's
    distribution."""
    with torch.no_grad():
        logits = model(torch.tensor([sequence]))
        logits = logits[0] if isinstance(logits, tuple) else logits
    every = torch.log_softmax(logits[0].float(), dim=-1)  # (T, V): position t scores token t + 1
    return every[torch.arange(len(sequence) - 1), torch.tensor(sequence[1:])].tolist(), every


@pytest.mark.parametrize("prefill_chunk", [256, 3])  # 3: the prompt scored over several iterations
def test_logprobs_of_the_prompt_and_the_answer_are_the_trainers_within_1e_5(prefill_chunk):
    model, engine = _engine(dict(positions="rope", n_kv_heads=2), prefill_chunk=prefill_chunk, prefix_blocks=8)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    engine.submit(Request(list(prompt), ListSink(), max_tokens=2))  # fills the prefix cache with the prompt
    _drain(engine)
    scored, streamed = ListSink(), ListSink()
    engine.submit(Request(list(prompt), scored, max_tokens=6, sampling=Sampling(logprobs=3, prompt_logprobs=2)))
    engine.submit(Request([1, 2], streamed, max_tokens=4, stream=True, sampling=Sampling(logprobs=0)))
    _drain(engine)
    result = scored.result
    reference, every = _trainer_logprobs(model, prompt + result.token_ids)
    got = [p.logprob for p in result.prompt_logprobs + result.logprobs]
    assert len(result.prompt_logprobs) == len(prompt) - 1 and len(result.logprobs) == 6
    assert [p.token_id for p in result.prompt_logprobs + result.logprobs] == (prompt + result.token_ids)[1:]
    assert max(abs(a - b) for a, b in zip(got, reference)) < 1e-5
    for position, p in enumerate(result.prompt_logprobs + result.logprobs):
        values, ids = every[position].topk(3 if position >= len(prompt) - 1 else 2)
        assert [t for t, _ in p.top] == ids.tolist()
        assert max(abs(v - w) for (_, v), w in zip(p.top, values.tolist())) < 1e-5
    # greedy: each generated token is the most likely one, so it heads its own list
    assert all(p.top[0] == (p.token_id, p.logprob) for p in result.logprobs)
    assert [lp.token_id for _, _, lp in streamed.tokens] == streamed.result.token_ids
    assert all(lp.top == () for _, _, lp in streamed.tokens) and streamed.result.prompt_logprobs is None


def test_without_logprobs_asked_the_result_has_none():
    _, engine = _engine()
    sink = ListSink()
    engine.submit(Request([1, 2, 3], sink, max_tokens=3))
    _drain(engine)
    assert sink.result.logprobs is None and sink.result.prompt_logprobs is None


def test_penalties_lower_the_generated_tokens_as_openai_defines_them():
    """Each token's logit less presence_penalty once it appeared and frequency_penalty per time: the tokens of the
    trainer model decoded greedily by that rule, fewer repeats than without."""
    model, engine = _engine()
    sampling = Sampling(presence_penalty=0.5, frequency_penalty=1.0)
    penalized, plain = ListSink(), ListSink()
    engine.submit(Request([1, 2, 3], penalized, max_tokens=24, sampling=sampling))
    engine.submit(Request([1, 2, 3], plain, max_tokens=24))  # decoded beside it, without penalties
    _drain(engine)
    ids, counts = [1, 2, 3], torch.zeros(model.spec.vocab_size)
    with torch.no_grad():
        for _ in range(24):
            logits = model(torch.tensor([ids]))[0, -1]
            token = int((logits - 0.5 * (counts > 0) - 1.0 * counts).argmax())
            counts[token] += 1
            ids.append(token)
    assert penalized.result.token_ids == ids[3:]
    assert plain.result.token_ids == generate(model, [1, 2, 3], 24, temperature=0)[3:]
    assert len(set(penalized.result.token_ids)) > len(set(plain.result.token_ids))


ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}, "sure": {"type": "boolean"}},
                 "required": ["answer", "sure"], "additionalProperties": False}


def test_a_guided_answer_is_json_of_its_schema_and_ends_there(tmp_path):
    """An untrained model, held to a JSON schema token by token (greedy and sampled, beside an unguided answer):
    every answer parses and validates, and ends with the end of text the grammar leaves as the only choice."""
    import jsonschema

    from deploy.serving.guide import Guides
    from deploy.serving.layout import Codec
    from tests.webapp.serving import byte_tokenizer_json

    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    codec = Codec(tmp_path / "tokenizer.json")
    _, engine = _engine(codec=codec)
    guides = Guides(tmp_path / "tokenizer.json", MODELS["tiny"].vocab_size, codec.eos_id)
    guide = json.dumps({"json_schema": ANSWER_SCHEMA})
    sinks = {name: ListSink() for name in ("greedy", "sampled", "object", "free")}
    for name, sampling, asked in (("greedy", Sampling(), guide), ("sampled", Sampling(temperature=1.0, seed=3), guide),
                                  ("object", Sampling(), json.dumps({"json_object": True})), ("free", Sampling(), "")):
        engine.submit(Request(codec.encode("Answer in JSON: "), sinks[name], max_tokens=60, sampling=sampling,
                              guided=guides.start(asked) if asked else None))
    _drain(engine)
    for name in ("greedy", "sampled"):
        result = sinks[name].result
        jsonschema.validate(json.loads(result.text), ANSWER_SCHEMA)
        assert result.finish_reason == "stop" and result.token_ids[-1] == codec.eos_id, name
    assert sinks["object"].result.text.startswith("{")  # any object: an untrained model need not close it in 60
    assert sinks["free"].result.finish_reason == "length"  # the same model, unguided, writes no such thing


@pytest.mark.parametrize("guide, words", [("{", "not JSON"), ('{"json_schema": 3}', "schema as a JSON object"),
                                          ('{"regex": "a+"}', "json_schema")])
def test_a_guide_that_cannot_be_followed_is_refused_with_the_reason(tmp_path, guide, words):
    from deploy.serving.guide import GuideError, Guides
    from tests.webapp.serving import byte_tokenizer_json

    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    with pytest.raises(GuideError, match=words):
        Guides(tmp_path / "tokenizer.json", 512, 256).start(guide)

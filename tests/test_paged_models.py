"""Serving through the paged cache (`models.paged`: `PagedCache`, `Engine`) on the CPU in float32,
against transformers' own outputs for the tiny checkpoints of tests/data/models/: each
request's greedy tokens equal transformers' for its prompt alone, and each generated token's
logits equal transformers' logits of the same sequence, whatever the schedule: prompts of
different lengths prefilled in chunks between decode steps, requests joining while others
decode, a request waiting for a slot or for blocks, a bucket with idle rows, a stop token.
Families: Qwen3 (the schedules), Qwen3.5 (linear-attention states in slot pools), gpt-oss (sinks,
a sliding window over pages, experts).
"""
from __future__ import annotations

import numpy as np
import pytest
from tinygrad import Tensor

from nuvec_tg import models
from reference import assert_rows_close
from test_models import TOL, fixture, model, reference


def served(engine: models.Engine, *made: list[tuple[int, int]]) -> dict[int, list[int]]:
    """Every request's tokens: those of steps already `made`, then as `run` yields them."""
    tokens: dict[int, list[int]] = {}
    for request, token in [pair for step in made for pair in step] + list(engine.run()):
        tokens.setdefault(request, []).append(token)
    return tokens


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5", "gpt_oss"])
def test_interleaved_prefills_and_batched_decode_give_transformers_tokens_and_logits(name):
    """Prompts of 5 and 11 tokens in chunks of 4: the remainders one chunk of 4 rows, junk rows after
    the prompt (4 + 1, 4 + 4 + 3), where every layer is attention (Qwen3, gpt-oss), else in powers
    of two (Qwen3.5's states: 4 + 1, 4 + 4 + 2 + 1); the second's prefill runs between the first's
    decode steps, then both decode in one batch; each token and its logits are transformers'
    (`sequence_logits_1` is the 11-token prompt followed by its greedy tokens)."""
    ref, m = reference(name), model(name)
    engine = models.Engine(m, max_sequences=4, max_length=64, prefill_chunk=4)
    short = engine.submit(ref["prompt_0"].tolist(), max_tokens=8, stop_tokens=())
    long = engine.submit(ref["prompt_1"].tolist(), max_tokens=8, stop_tokens=(), keep_logits=True)
    long_chunks = 3 if engine.pads_prompts else 4
    assert engine.pads_prompts == (name != "qwen3_5")
    first_steps = [engine.step() for _ in range(2 + long_chunks)]
    # the short prompt is in after two chunks and decodes while the long one's chunks run
    assert [[r for r, _ in made] for made in first_steps] == [[], [short]] + [[short]] * (long_chunks - 1) + [[short, long]]
    assert sorted(engine.prefills) == ([(4, False), (4, True)] if engine.pads_prompts else [(1, True), (2, False), (4, False)])
    tokens = served(engine, *first_steps)
    np.testing.assert_array_equal(tokens[short], ref["greedy_0"])
    np.testing.assert_array_equal(tokens[long], ref["greedy_1"])
    prompt = len(ref["prompt_1"])
    want = ref["sequence_logits_1"][prompt - 1:prompt + 7]
    assert_rows_close(f"{name} logits", np.stack(engine.requests[long].logits), want, TOL)
    assert not engine.busy and len(engine.cache.free_slots) == 4 and len(engine.cache.free_blocks) == engine.cache.blocks


def test_requests_wait_for_blocks_and_slots_and_join_a_running_batch():
    """Blocks for three of four requests (of 4 positions, 9 in all): the fourth waits with a slot
    free until one finishes and gives its blocks back, then joins those still decoding; three
    decode at once in a bucket of four (an idle row). With one slot, a second request waits for
    it. Every request's tokens are transformers' for its prompt alone; a request that could never
    fit is refused at submit."""
    ref, m = reference("qwen3"), model("qwen3")
    p0, p1, g0, g1 = ref["prompt_0"].tolist(), ref["prompt_1"].tolist(), ref["greedy_0"], ref["greedy_1"]
    wants = [(p0, g0), (p0, g0), (p1, g1[:2]), (p0, g0[:4])]              # 3, 3, 3 and 2 blocks
    engine = models.Engine(m, max_sequences=4, max_length=32, block_size=4, blocks=9, prefill_chunk=16)
    ids = [engine.submit(p, max_tokens=len(w), stop_tokens=()) for p, w in wants]
    made = engine.step()
    assert [r.id for r in engine.waiting] == ids[3:] and engine.cache.free_slots and not engine.cache.free_blocks
    tokens = served(engine, made)
    for i, (_, want) in zip(ids, wants): np.testing.assert_array_equal(tokens[i], want)
    assert sorted(engine.steps) == [(1, True), (2, True), (4, True)]
    one = models.Engine(m, max_sequences=1, max_length=32, prefill_chunk=16)
    first, second = one.submit(p1, max_tokens=3, stop_tokens=()), one.submit(p0, max_tokens=3, stop_tokens=())
    made = one.step()
    assert [r.id for r in one.waiting] == [second]
    tokens = served(one, made)
    assert tokens[first] == g1[:3].tolist() and tokens[second] == g0[:3].tolist()
    with pytest.raises(ValueError, match="exceed max_length 32"):
        engine.submit([1] * 30, max_tokens=4)
    with pytest.raises(ValueError, match="needs 10 blocks, the pools hold 9"):
        models.Engine(m, max_sequences=2, max_length=40, block_size=4, blocks=9).submit([1] * 30, max_tokens=10)


def test_a_stop_token_ends_a_request_and_frees_its_slot():
    ref, m = reference("qwen3"), model("qwen3")
    engine = models.Engine(m, max_sequences=2, max_length=64)
    stopping = engine.submit(ref["stop_prompt"].tolist(), max_tokens=8)
    other = engine.submit(ref["prompt_1"].tolist(), max_tokens=8, stop_tokens=())
    tokens = served(engine)
    assert tokens[stopping] == ref["stop_output"].tolist() and engine.requests[stopping].finished
    np.testing.assert_array_equal(tokens[other], ref["greedy_1"])


def test_sampled_requests_repeat_their_seed_and_greedy_ones_stay_greedy():
    """A sampled request beside a greedy one: the step returns logits, each request samples with
    its own generator (the same seed, the same tokens) and the greedy one keeps its tokens."""
    ref, m = reference("qwen3"), model("qwen3")
    runs = []
    for _ in range(2):
        engine = models.Engine(m, max_sequences=2, max_length=64)
        sampled = engine.submit(ref["prompt_0"].tolist(), max_tokens=6, temperature=0.8, top_k=20, seed=7, stop_tokens=())
        greedy = engine.submit(ref["prompt_1"].tolist(), max_tokens=8, stop_tokens=())
        tokens = served(engine)
        np.testing.assert_array_equal(tokens[greedy], ref["greedy_1"])
        runs.append(tokens[sampled])
        assert (2, False) in engine.steps
    assert runs[0] == runs[1] and len(runs[0]) == 6


def test_prompts_of_any_length_prefill_through_a_few_fixed_chunk_lengths():
    """A serving engine meets a new prompt length with nearly every request: its prefill chunks
    take `prefill_chunk` rows, or a prompt's remainder as one chunk of a multiple of
    PREFILL_BUCKET rows (at most the chunk's; junk rows after it) where the model allows (Qwen3),
    else a power of two below it (a recurrent state's: the interleaved test's Qwen3.5), so the
    jitted prefills are at most two per length of that set (last chunk or not) and every one is
    kept: Qwen3's prompts of 1 to 12 tokens in chunks of 8 make the two of 8 rows, and a second
    round over the same lengths none at all; a request's first token is its prompt's greedy token
    alone (`Model.generate_tokens`)."""
    chunk_rows, bucket = models.paged.chunk_rows, models.model.PREFILL_BUCKET
    assert [chunk_rows(r, 8, False) for r in (1, 2, 3, 7, 8, 9, 300)] == [(1, 1), (2, 2), (2, 2), (4, 4), (8, 8), (8, 8), (8, 8)]
    assert [chunk_rows(r, 300, False) for r in (299, 300, 301)] == [(256, 256), (300, 300), (300, 300)]
    assert [chunk_rows(r, 8, True) for r in (1, 7, 8, 9)] == [(1, 8), (7, 8), (8, 8), (8, 8)]
    assert [chunk_rows(r, 512, True) for r in (1, bucket, bucket + 1, 300, 511, 513)] == \
        [(1, bucket), (bucket, bucket), (bucket + 1, 2 * bucket), (300, 320), (511, 512), (512, 512)]
    ref, m = reference("qwen3"), model("qwen3")
    engine = models.Engine(m, max_sequences=2, max_length=32, prefill_chunk=8)
    prompt = ref["prompt_1"].tolist() + ref["prompt_0"].tolist()
    ids = [engine.submit(prompt[:length], max_tokens=1, stop_tokens=()) for length in range(1, 13)]
    tokens = served(engine)
    for length in (3, 12):
        assert tokens[ids[length - 1]] == next(m.generate_tokens([prompt[:length]], max_tokens=1, stop_tokens=())), length
    made = dict(engine.prefills)
    assert set(made) == {(8, True), (8, False)}
    for length in range(1, 13):
        engine.submit(prompt[:length], max_tokens=1, stop_tokens=())
    served(engine)
    assert all(engine.prefills[key] is jit for key, jit in made.items()) and set(engine.prefills) == set(made)


def test_engine_arguments_are_checked():
    m = model("qwen3")
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        models.Engine(m, block_size=12)
    with pytest.raises(ValueError, match="sequences and max_length must be positive"):
        models.PagedCache(m, 0, 16)
    engine = models.Engine(m, max_sequences=1, max_length=16)
    with pytest.raises(ValueError, match="at least one token"):
        engine.submit([])
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        engine.submit([1], max_tokens=0)
    assert not engine.busy and fixture("qwen3").is_dir() and isinstance(engine.cache.buffers()[0], Tensor)

"""`models.random_model`: a tiny Qwen3 with random weights built from its config alone runs a
forward pass with finite logits and a short greedy generation; its weights come from the seed
(and each tensor's name), norms are ones, the rest about normal * 0.02; a tensor asked for
without a shape is missing, as in a checkpoint."""
from __future__ import annotations

import numpy as np
import pytest
from tinygrad import dtypes
from tinygrad.uop.ops import Ops

from nuvec_tg import models
from nuvec_tg.models.random_weights import RandomCheckpoint, random_normal

CONFIG = {"model_type": "qwen3", "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
          "intermediate_size": 64, "vocab_size": 64, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
          "tie_word_embeddings": False, "max_position_embeddings": 4096, "eos_token_id": 63}


@pytest.fixture(scope="module")
def model():
    return models.random_model(CONFIG, dtype="float32", device="CPU")


def down(m: models.Model) -> np.ndarray:
    return m.layers[0].mlp.down.weights[0].numpy()


def test_a_random_model_runs_a_forward_and_generates(model):
    # a cached forward in a cache as long as generate's (256), so that the generation reuses its kernels
    logits = model(np.array([[1, 2, 3, 4]], dtype=np.int32), cache=model.make_cache(1, 256)).numpy()
    assert logits.shape == (1, 4, 64) and np.isfinite(logits).all() and logits.std() > 0
    steps = list(model.generate_tokens([[1, 2, 3, 4]], max_tokens=3, stop_tokens=()))
    assert len(steps) == 3 and all(len(s) == 1 and 0 <= s[0] < 64 for s in steps)
    stats = model.last_generation
    assert (stats.prompt_tokens, stats.generated_tokens) == (4, 3)
    assert model.eos_token_ids == (63,)


def test_the_weights_come_from_the_seed_norms_are_ones(model):
    w = down(model)
    assert w.shape == (32, 64) and 0.015 < w.std() < 0.025 and abs(w.mean()) < 0.005
    assert np.array_equal(w, down(models.random_model(CONFIG, dtype="float32", device="CPU", seed=0)))
    assert not np.allclose(w, down(models.random_model(CONFIG, dtype="float32", device="CPU", seed=1)))
    assert (model.norm.weight.numpy() == 1).all() and (model.layers[0].attention.q_norm.weight.numpy() == 1).all()


def test_random_normal_is_about_standard_normal_and_differs_by_key():
    a = random_normal((256, 256), 7, dtypes.float32, "CPU").numpy()
    b = random_normal((256, 256), 8, dtypes.float32, "CPU").numpy()
    assert abs(a.mean()) < 0.02 and abs(a.std() - 1) < 0.02 and np.abs(a).max() < 2 * 3 ** 0.5
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.02


def test_a_tensor_asked_for_without_a_shape_is_missing():
    checkpoint = RandomCheckpoint(dtypes.float32, "CPU")
    checkpoint.require("a.weight", (2, 3))
    assert "a.weight" in checkpoint and checkpoint.shape("a.weight") == (2, 3) and "b.weight" not in checkpoint
    with pytest.raises(ValueError, match="b.weight is missing"):
        checkpoint.require("b.weight")
    with pytest.raises(ValueError, match="expected"):
        checkpoint.require("a.weight", (3, 2))


def test_an_unknown_family_and_a_missing_dtype_say_so():
    with pytest.raises(ValueError, match="unknown model_type 'nope'"):
        models.random_model({**CONFIG, "model_type": "nope"})
    with pytest.raises(TypeError, match="dtype"):
        models.random_model(CONFIG, dtype=None)


def test_fused_random_projections_schedule_no_reduction():
    """Concatenating random tensors (a fused projection's parts) stays elementwise: on a bare
    arange the concatenation schedules a reduction over every element, quadratic in the size."""
    checkpoint = RandomCheckpoint(dtypes.float32, "CPU")
    names = [f"layers.0.proj_{i}.weight" for i in range(3)]
    for name, rows in zip(names, (64, 32, 8)): checkpoint.require(name, (rows, 48))

    def fused():
        parts = [checkpoint.tensor(name) for name in names]
        return parts[0].cat(*parts[1:], dim=-2)
    # scheduling without running rebinds the tensors to buffers never filled: values from new ones
    assert not any(u.op is Ops.REDUCE for u in fused().schedule_linear().toposort())
    alone = np.concatenate([checkpoint.tensor(name).numpy() for name in names], axis=0)
    np.testing.assert_array_equal(fused().numpy(), alone)
    assert 0.015 < alone.std() < 0.025

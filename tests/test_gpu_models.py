"""nuvec_tg.models on a GPU (METAL or CUDA): the fixtures against transformers' and mlx-lm's
logits, and a random Qwen3 checkpoint with 128-wide heads, whose decode steps run the decode
attention kernels over a symbolic key count and the gemv kernels (qmv when quantized), against the
full forward on the same device and, where torch and transformers are installed, transformers'."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from tinygrad import Device, Tensor, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import models
from nuvec_tg.kernels import record_launches
from reference import assert_rows_close

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
MODELS = pathlib.Path(__file__).resolve().parent / "data" / "models"
TOL = {dtypes.float32: 2e-4, dtypes.float16: 1e-2, dtypes.bfloat16: 5e-2}


def fixture(name: str) -> pathlib.Path:
    directory = MODELS / name
    if not directory.is_dir(): pytest.skip(f"fixture tests/data/models/{name} is absent (scripts/make_model_fixtures.py)")
    return directory


def logits_of(t: Tensor) -> np.ndarray:
    return t.cast(dtypes.float32).numpy()


@pytest.mark.parametrize("name, reference_key", [("qwen3", "logits_1"), ("qwen3_moe", "logits_1"), ("gemma3", "logits_1"),
                                                 ("gpt_oss", "logits_1"), ("qwen3_next", "logits_1"), ("qwen3_5", "logits_1"),
                                                 ("qwen3_moe_mlx4", "logits_f32_1")])
def test_fixtures_match_their_references_on_the_gpu(name, reference_key):
    ref = np.load(fixture(name) / "reference.npz")
    m = models.load(fixture(name), dtype="float32", device=gpu, progress=False)
    assert_rows_close(name, logits_of(m(ref["prompt_1"][None]))[0], ref[reference_key], TOL[dtypes.float32])
    if "sequence_1" in ref.files:
        sequence, want = ref["sequence_1"], ref["sequence_logits_1"]
        cache = m.make_cache(1, 256)
        m(sequence[None, :11], cache=cache)
        for i in range(11, len(sequence)):
            assert_rows_close(f"{name} step {i}", logits_of(m(sequence[None, i:i + 1], cache=cache))[0], want[i:i + 1],
                              TOL[dtypes.float32])


def random_qwen3(directory: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """A random two-layer Qwen3 checkpoint with the decode kernels' head size (128), 8 query and
    2 key heads, float32 weights."""
    rng = np.random.default_rng(seed)
    hidden, heads, kv_heads, head_dim, intermediate, vocab, layers = 256, 8, 2, 128, 512, 512, 2
    config = {"model_type": "qwen3", "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "intermediate_size": intermediate, "vocab_size": vocab, "num_hidden_layers": layers,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False, "max_position_embeddings": 4096,
              "eos_token_id": [vocab - 1]}
    def linear(out, inp): return rng.standard_normal((out, inp)).astype(np.float32) / np.sqrt(inp)
    def norm(size): return (1 + 0.1 * rng.standard_normal(size)).astype(np.float32)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((vocab, hidden)).astype(np.float32),
               "model.norm.weight": norm(hidden), "lm_head.weight": linear(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors.update({f"{p}.self_attn.q_proj.weight": linear(heads * head_dim, hidden),
                        f"{p}.self_attn.k_proj.weight": linear(kv_heads * head_dim, hidden),
                        f"{p}.self_attn.v_proj.weight": linear(kv_heads * head_dim, hidden),
                        f"{p}.self_attn.o_proj.weight": linear(hidden, heads * head_dim),
                        f"{p}.self_attn.q_norm.weight": norm(head_dim), f"{p}.self_attn.k_norm.weight": norm(head_dim),
                        f"{p}.mlp.gate_proj.weight": linear(intermediate, hidden),
                        f"{p}.mlp.up_proj.weight": linear(intermediate, hidden),
                        f"{p}.mlp.down_proj.weight": linear(hidden, intermediate),
                        f"{p}.input_layernorm.weight": norm(hidden), f"{p}.post_attention_layernorm.weight": norm(hidden)})
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    write_safetensors(directory / "model.safetensors", tensors)
    return directory


def write_safetensors(path: pathlib.Path, tensors: dict[str, np.ndarray]) -> None:
    """float32 arrays in the safetensors layout (a little-endian u64 header size, the JSON header,
    the data), written by numpy: tinygrad's safe_save copies through its CPU device, which a GPU
    machine without a C compiler cannot open."""
    tensors = {name: np.ascontiguousarray(array, dtype="<f4") for name, array in tensors.items()}
    header, offset = {}, 0
    for name, array in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little") + encoded)
        for array in tensors.values(): f.write(array.tobytes())


def transformers_logits(checkpoint: pathlib.Path, tokens: np.ndarray) -> np.ndarray | None:
    """transformers' float32 logits for `tokens` on PyTorch's CPU, or None where torch or
    transformers is not installed (the H200 has both; CI needs neither)."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad(): return reference(torch.from_numpy(tokens).long()).logits.numpy()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return random_qwen3(tmp_path_factory.mktemp("qwen3_d128"))


@pytest.mark.parametrize("dtype, quantize", [(dtypes.float32, None), (dtypes.bfloat16, None), (dtypes.bfloat16, 4)],
                         ids=["float32", "bfloat16", "bfloat16-q4"])
def test_jitted_decode_steps_run_the_kernels_and_equal_the_full_forward(checkpoint, dtype, quantize):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 511, size=(2, 40)).astype(np.int32)
    m = models.load(checkpoint, dtype=dtype, quantize=quantize, device=gpu, progress=False)
    want = logits_of(m(tokens))
    reference = transformers_logits(checkpoint, tokens) if dtype == dtypes.float32 and quantize is None else None
    if reference is not None: assert_rows_close("full forward vs transformers", want, reference, TOL[dtype])
    cache = m.make_cache(2, 256)
    assert_rows_close("prefill", logits_of(m(tokens[:, :24], cache=cache)), want[:, :24], TOL[dtype])
    compiler = Device[gpu].compiler
    compiled, original = [], compiler.compile
    compiler.compile = lambda src: compiled.append(src) or original(src)
    try:
        with record_launches() as launches:
            for i in range(24, 40):
                got = logits_of(m(tokens[:, i:i + 1], cache=cache))
                assert_rows_close(f"step {i}", got, want[:, i:i + 1], TOL[dtype])
                if i == 25: after_capture = len(compiled)
    finally:
        compiler.compile = original
    programs = {program for program, _ in launches}
    assert any("sdpa" in p for p in programs), f"no decode attention kernel ran: {programs}"
    if quantize: assert any("qmv" in p for p in programs), f"no qmv kernel ran: {programs}"
    else: assert any("gemv" in p for p in programs), f"no gemv kernel ran: {programs}"  # the dense projections
    assert len(compiled) == after_capture, "a decode step compiled after the jit captured"

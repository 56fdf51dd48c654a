"""End-to-end generation (`python -m nuvec_tg.bench model`): language models at real sizes with
random weights (`nuvec_tg.models.random_model`, made on the device from a config; no checkpoint),
a prompt of 512 random tokens then 128 generated greedily, B = 1 and 8 sequences, in bfloat16
and quantized at load to 4-bit affine (groups of 64): prefill tokens/s, decode tokens/s and ms
per decode step, beside transformers' (eager attention and SDPA, bfloat16, the same shape from
`AutoModelForCausalLM.from_config`, random weights), all wall clock as a user sees them.

nuvec_tg: one warm-up generation of the same shape first, so that the kernels' compiles are not
timed; then `Model.generate_tokens` with no stop tokens, split into its phases as
`Model.last_generation` records them: prefill (the prompt's forward and the first token read
back) and decode (the other G - 1 tokens: greedy steps chained on the device, their tokens read
back in groups). The model keeps its last generation's cache and empties it for the next of the
same shape, jitted step included: the warm-up generation captures the step, the timed ones replay
it, as a user's second generation would. ms per decode step is the decode phase over its steps;
the host / device split replays the step after the generation (`step_split`): the host's time
until a replay returns, and replays queued back to back (the device's time a step).

transformers (when torch and transformers import): measured first, before tinygrad opens the
GPU (tinygrad makes its own CUDA context current, in which PyTorch's handles are invalid), and
freed before our models are made. A manual greedy loop over the model's own cache (DynamicCache
for Qwen3): prefill is one forward of the prompt (logits of the last row only, as `generate`
asks) and its argmax, decode each one-token forward and argmax, CUDA synchronized before every
clock read; one warm-up run first.

After the table, per config and format: the weight bytes, and the decode step's implied bandwidth
(the weights a step reads, all but the embedding table unless it is the head, plus the K/V rows
it reads at the decode's mean position and any recurrent state read and written, over the
step's device time) against the device's peak.

`--small` runs tiny configs of the same families (float32 on the CPU, which has no bfloat16
conversions). `--configs` picks among Qwen3-8B and Qwen3.5-9B (the default) and Qwen3-32B's shape;
`--devices N` splits the models over the default device's first N (`models.parallel`), and adds a
table of the step's sums across the devices timed alone (`all_reduce_step`).
"""
from __future__ import annotations

import dataclasses
import gc
import statistics
import sys
import time

import numpy as np
from tinygrad import Device, Tensor, TinyJit, dtypes

from .. import models
from ..models.cache import KVCache
from ..models.rope import RotaryEmbedding
from .common import PEAK_BANDWIDTH, commit, device_name, is_gpu, release_torch

# Qwen3-8B's config.json (Qwen/Qwen3-8B, transformers 4.51's spelling).
QWEN3_8B = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
    "vocab_size": 151936, "rope_theta": 1000000.0, "rope_scaling": None, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu", "max_position_embeddings": 40960,
    "max_window_layers": 36, "use_sliding_window": False, "sliding_window": None, "bos_token_id": 151643,
    "eos_token_id": 151645, "initializer_range": 0.02,
}

# Qwen3.5-9B's language model (the `text_config` of Qwen/Qwen3.5-9B's config.json): 32 layers, each
# fourth full attention (gated, 16/4 heads of 256, a quarter of each head rotated), the others
# gated-delta linear attention (16 key heads, 32 value heads, of 128; a causal conv of 4), hidden
# 4096, MLP 12288, vocabulary 248320, untied head; 8.95e9 parameters. Sources: transformers 5's
# Qwen3_5TextConfig, whose defaults are "the Qwen3.5-9B style configuration", the model card's
# layout, and a fine-tune's config.json that names Qwen/Qwen3.5-9B for the key names; rope_theta
# (1e7) from secondary sources only (it changes no timing). Here with model_type "qwen3_5" at the
# top level (the text config's keys flattened, as `Config` merges a checkpoint's `text_config`).
QWEN3_5_9B = {
    "model_type": "qwen3_5", "hidden_size": 4096, "num_hidden_layers": 32,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8,
    "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
    "attn_output_gate": True, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "intermediate_size": 12288, "vocab_size": 248320,
    "partial_rotary_factor": 0.25,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
    "max_position_embeddings": 262144, "eos_token_id": 248044, "initializer_range": 0.02,
}

# --small: the same families at toy sizes (they check the benchmark, not the speed).
QWEN3_TINY = {**QWEN3_8B, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "max_window_layers": 2, "bos_token_id": None,
              "eos_token_id": 255}
QWEN3_5_TINY = {**QWEN3_5_9B, "hidden_size": 64, "num_hidden_layers": 4, "layer_types": QWEN3_5_9B["layer_types"][:4],
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "linear_num_key_heads": 2,
                "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                "intermediate_size": 128, "vocab_size": 256, "eos_token_id": 255}

# Qwen3-32B's shape (Qwen/Qwen3-32B's config.json): issue 27's model for several GPUs, 65.5 GB in bf16.
QWEN3_32B = {**QWEN3_8B, "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
             "num_key_value_heads": 8, "intermediate_size": 25600, "max_window_layers": 64}

CONFIGS = {"qwen3_8b": QWEN3_8B, "qwen3_5_9b": QWEN3_5_9B, "qwen3_32b": QWEN3_32B}
SMALL_CONFIGS = {"qwen3_8b": QWEN3_TINY, "qwen3_5_9b": QWEN3_5_TINY, "qwen3_32b": QWEN3_TINY}
DEFAULT_CONFIGS = "qwen3_8b,qwen3_5_9b"   # without --configs (qwen3_32b is for --devices)
FORMATS = {"dense": None, "q4": 4}          # --formats: quantize= at load (4: affine, groups of 64)
# transformers' model_type for a config's language model where it differs from ours
TRANSFORMERS_TYPES = {"qwen3_5": "qwen3_5_text"}
TRANSFORMERS_IMPLEMENTATIONS = ("eager", "sdpa")
COLUMNS = ["config", "stack", "dtype/quant", "B", "prefill tokens/s", "decode tokens/s", "ms per decode step",
           "host ms / device ms a step"]


@dataclasses.dataclass
class Timing:
    """One shape's best phases over the timed generations (seconds)."""
    batch: int
    prompt_tokens: int        # B x prompt
    prefill_s: float
    decode_tokens: int        # B x (G - 1)
    decode_s: float
    steps: int                # G - 1
    split: tuple[float, float] | None = None   # ours: a step's host and device seconds (`step_split`)

    @property
    def step_s(self) -> float:
        """The decode phase over its steps: the wall clock of a step as a user waits for it."""
        return self.decode_s / self.steps

    def cells(self) -> str:
        split = "-" if self.split is None else f"{self.split[0] * 1e3:.2f} / {self.split[1] * 1e3:.2f}"
        return (f"{self.prompt_tokens / self.prefill_s:.0f} | {self.decode_tokens / self.decode_s:.1f} | "
                f"{self.step_s * 1e3:.2f} | {split} |")


def best(runs: list[tuple[float, float, list[float]]], batch: int, prompt: int, generate: int) -> Timing:
    """The fastest prefill and decode of runs `(prefill s, decode s, step seconds)`."""
    return Timing(batch, batch * prompt, min(r[0] for r in runs), batch * (generate - 1), min(r[1] for r in runs),
                  generate - 1)


# ---- nuvec_tg ------------------------------------------------------------------------------------

def random_prompts(batch: int, prompt: int, vocab: int, seed: int = 0) -> list[list[int]]:
    return np.random.default_rng(seed).integers(0, vocab, (batch, prompt)).tolist()


def generation(model: models.Model, prompts: list[list[int]], generate: int) -> tuple[float, float, list[float]]:
    """One greedy generation of `generate` tokens a sequence: the prefill and decode seconds as
    `last_generation` records them, and each decode step's seconds (between the tokens' arrivals)."""
    arrivals = []
    for _ in model.generate_tokens(prompts, max_tokens=generate, stop_tokens=()):
        arrivals.append(time.perf_counter())
    stats = model.last_generation
    if stats.generated_tokens != len(prompts) * generate:
        raise RuntimeError(f"bench model: generated {stats.generated_tokens} tokens, expected {len(prompts) * generate}")
    return stats.prompt_seconds, stats.generation_seconds, list(np.diff(arrivals))


def time_ours(model: models.Model, batch: int, prompt: int, generate: int, repeats: int) -> tuple[Timing, float]:
    """The best of `repeats` generations after a warm-up one, with the decode step's host/device
    split; and the warm-up's seconds."""
    prompts = random_prompts(batch, prompt, model.vocab_size)
    began = time.perf_counter()
    generation(model, prompts, generate)
    warm = time.perf_counter() - began
    timing = best([generation(model, prompts, generate) for _ in range(repeats)], batch, prompt, generate)
    timing.split = step_split(model)
    return timing, warm


def step_split(model: models.Model, steps: int = 16) -> tuple[float, float]:
    """The greedy decode step of the model's last generation (its kept cache and jitted step),
    replayed past its rows: host seconds (the median replay's time until the call returns, the
    device idle before it) and device seconds (`steps` replays queued back to back, then one
    synchronisation: a step's time when the host runs ahead, as `generate_tokens` queues them)."""
    cache = model._generation_cache
    steps = min(steps, (cache.max_length - cache.position) // 2)
    hosts = []
    for _ in range(steps):
        synchronize(model)
        began = time.perf_counter()
        model._step_chained(cache)
        hosts.append(time.perf_counter() - began)
    synchronize(model)
    began = time.perf_counter()
    for _ in range(steps): model._step_chained(cache)
    synchronize(model)
    return statistics.median(hosts), (time.perf_counter() - began) / steps


def synchronize(model: models.Model) -> None:
    """Wait for every device the model runs on."""
    for name in (model.device if isinstance(model.device, tuple) else (model.device,)): Device[name].synchronize()


def device_sums(model: models.Model) -> tuple[int, int]:
    """A tensor-parallel model's sums across devices in a decode step: (how many of `[B, 1, hidden]`
    (one after each attention or DeltaNet, one after each MLP, MoE and shared expert), and of
    `[B, 1, vocab]` (the head's gather: 1 where the head is split by vocabulary, else 0))."""
    sums = sum(1 + len(models.parallel.mlps(block.mlp)) for block in model.layers)
    return sums, int(model.head is not None and model.head.owned is not None)


def all_reduce_step(model: models.Model, batch: int, replays: int = 16) -> float:
    """Device seconds of a decode step's sums across devices alone (`device_sums`): one jitted
    function chaining the all-reduces of a step's sizes, replayed `replays` times back to back."""
    from ..models.layers import all_reduce
    hidden_sums, head_sums = device_sums(model)
    hidden = Tensor.zeros(batch, 1, model.config.integer("hidden_size"), dtype=model.dtype, device=model.device).contiguous().realize()
    logits = Tensor.zeros(batch, 1, model.vocab_size, dtype=model.dtype, device=model.device).contiguous().realize()

    @TinyJit
    def sums(h: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        for _ in range(hidden_sums): h = all_reduce(h).realize()
        for _ in range(head_sums): z = all_reduce(z).realize()
        return h, z

    for _ in range(3): sums(hidden, logits)   # capture
    synchronize(model)
    began = time.perf_counter()
    for _ in range(replays): sums(hidden, logits)
    synchronize(model)
    return (time.perf_counter() - began) / replays


@dataclasses.dataclass
class Serving:
    """One engine run (seconds): `batch` requests of different prompt lengths submitted at once."""
    batch: int
    prompt_tokens: int
    generated: int
    total_s: float             # submit to the last token
    first_s: float             # submit to the last request's first token (every prompt in)
    full_step_s: float         # median step while every request decodes (no prefill in it)

    def cells(self) -> str:
        return (f"{self.prompt_tokens} | {self.total_s:.2f} | {self.generated / self.total_s:.1f} | "
                f"{self.first_s:.2f} | {self.full_step_s * 1e3:.2f} | {self.batch / self.full_step_s:.1f} |")


def serving_prompts(batch: int, prompt: int, vocab: int) -> list[list[int]]:
    """`batch` random prompts of lengths spread evenly from half of `prompt` to `prompt`."""
    lengths = np.linspace(max(prompt // 2, 1), prompt, batch).round().astype(int)
    rng = np.random.default_rng(2)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def serving(engine: models.Engine, prompts: list[list[int]], generate: int) -> Serving:
    """Every prompt submitted at once, `generate` greedy tokens each, run to the end."""
    began = time.perf_counter()
    for p in prompts: engine.submit(p, max_tokens=generate, stop_tokens=())
    first, full, generated = 0.0, [], 0
    while engine.busy:
        step_began = time.perf_counter()
        everyone = len(engine.running) == len(prompts)
        made = engine.step()
        if everyone: full.append(time.perf_counter() - step_began)
        generated += len(made)
        if not first and not engine.waiting and not engine.prefilling: first = time.perf_counter() - began
    total = time.perf_counter() - began
    if generated != len(prompts) * generate:
        raise RuntimeError(f"bench model: the engine made {generated} tokens, expected {len(prompts) * generate}")
    return Serving(len(prompts), sum(map(len, prompts)), generated, total, first,
                   statistics.median(full) if full else float("nan"))


def time_engine(model: models.Model, batch: int, prompt: int, generate: int, repeats: int) -> Serving:
    """The best (least total time) of `repeats` engine runs after a warm-up run on one engine (its
    jitted steps captured by the warm-up)."""
    prompts = serving_prompts(batch, prompt, model.vocab_size)
    engine = models.Engine(model, max_sequences=batch, max_length=prompt + generate)
    serving(engine, prompts, generate)
    return min((serving(engine, prompts, generate) for _ in range(repeats)), key=lambda run: run.total_s)


def largest_logit(model: models.Model, prompt: int, generate: int) -> float:
    """max |logit| of a cached prefill of one random prompt (NaN when any logit is not finite), in
    a cache as long as `generate_tokens` makes (so that its kernels are those of B = 1)."""
    tokens = np.array(random_prompts(1, prompt, model.vocab_size, seed=1), dtype=np.int32)
    logits = model(tokens, cache=model.make_cache(1, -(-(prompt + generate) // 256) * 256)).cast(dtypes.float32)
    if (logits.isnan() | logits.isinf()).any().item(): return float("nan")
    return float(logits.abs().max().item())


def tensors_of(obj, found: dict[int, Tensor]) -> dict[int, Tensor]:
    """Every tensor a model part holds (its weights: dense, quantized parts, biases), by id, not
    the rotary tables."""
    if isinstance(obj, Tensor): found[id(obj)] = obj
    elif isinstance(obj, (list, tuple)):
        for item in obj: tensors_of(item, found)
    elif isinstance(obj, dict):
        for item in obj.values(): tensors_of(item, found)
    elif isinstance(obj, (RotaryEmbedding, KVCache)): pass
    elif type(obj).__module__.startswith("nuvec_tg") and hasattr(obj, "__dict__"):
        for item in vars(obj).values(): tensors_of(item, found)
    return found


def nbytes(found: dict[int, Tensor]) -> int:
    return sum(t.nbytes() for t in found.values())


def weight_bytes(model: models.Model) -> tuple[int, int]:
    """All the weights' bytes, and those a decode step reads (not the embedding table, of which a
    step gathers B rows, unless it is also the head)."""
    everything = tensors_of([model.embed, model.layers, model.norm, model.head], {})
    read = tensors_of([model.layers, model.norm, model.head if model.head is not None else model.embed], {})
    return nbytes(everything), nbytes(read)


def cache_bytes_per_step(model: models.Model, batch: int, prompt: int, generate: int) -> int:
    """The cache bytes a decode step reads on average: K/V rows `[B, H, rows, D]` at the decode's
    mean position (prompt + G/2 rows), other cache state (recurrent) read and written whole."""
    length = prompt + generate  # a cache this long tells K/V buffers (axis 2 = its length) from state
    cache = model.make_cache(batch, length)
    total = 0
    for layer in cache.layers:
        for t in (layer or ()):
            if t.ndim == 4 and t.shape[2] == length: total += t.nbytes() * (prompt + generate / 2) / length
            else: total += 2 * t.nbytes()
    del cache
    return int(total)


# ---- transformers ----------------------------------------------------------------------------------

def transformers_config(config: dict):
    """transformers' config of the same language model."""
    from transformers import AutoConfig
    values = {k: v for k, v in config.items() if k != "model_type"}
    return AutoConfig.for_model(TRANSFORMERS_TYPES.get(config["model_type"], config["model_type"]), **values)


def set_attention(model, implementation: str) -> None:
    if hasattr(model, "set_attn_implementation"): model.set_attn_implementation(implementation)
    else: model.config._attn_implementation = implementation


def transformers_generation(torch, model, ids, generate: int, device: str) -> tuple[float, float, list[float], str]:
    """A greedy generation over the model's own cache: prefill and decode seconds, each decode
    step's seconds, and the cache's class."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    began = time.perf_counter()
    try:
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    except TypeError:  # a model without logits_to_keep
        out = model(input_ids=ids, use_cache=True)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    arrivals = [time.perf_counter()]
    cache = out.past_key_values
    for _ in range(generate - 1):
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        sync()
        arrivals.append(time.perf_counter())
    return arrivals[0] - began, arrivals[-1] - arrivals[0], list(np.diff(arrivals)), type(cache).__name__


def transformers_times(configs: dict, batches: list[int], prompt: int, generate: int, repeats: int,
                       small: bool) -> tuple[dict, list[str]]:
    """transformers' Timing (or why there is none, a string) per (config, implementation, B), and
    notes. On CUDA; with --small on the CPU where there is no CUDA device."""
    notes: list[str] = []
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        return {(name, impl, b): "not installed" for name in configs for impl in TRANSFORMERS_IMPLEMENTATIONS
                for b in batches}, ["transformers: torch or transformers is not installed"]
    device = "cuda" if torch.cuda.is_available() else "cpu" if small else None
    if device is None:
        return {(name, impl, b): "no CUDA device" for name in configs for impl in TRANSFORMERS_IMPLEMENTATIONS
                for b in batches}, ["transformers: PyTorch sees no CUDA device"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    try:
        import fla  # noqa: F401 - only whether it imports: transformers' fast gated-delta kernels
        fla_note = "flash-linear-attention installed"
    except ImportError:
        fla_note = "flash-linear-attention not installed (transformers' gated-delta layers run its PyTorch fallback)"
    notes.append(f"transformers {transformers.__version__}, torch {torch.__version__}, on {device}; {fla_note}")
    results: dict = {}
    for name, config in configs.items():
        model = None
        try:
            began = time.perf_counter()
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(transformers_config(config), dtype=dtype,
                                                         attn_implementation="eager")
            model.eval()
            if device == "cuda": torch.cuda.synchronize()
            notes.append(f"transformers {name}: {type(model).__name__} made in {time.perf_counter() - began:.1f} s")
            vocab = config["vocab_size"]
            for impl in TRANSFORMERS_IMPLEMENTATIONS:
                set_attention(model, impl)
                for b in batches:
                    generator = torch.Generator(device=device).manual_seed(0)
                    ids = torch.randint(0, vocab, (b, prompt), device=device, generator=generator)
                    with torch.inference_mode():
                        *_, cache_class = transformers_generation(torch, model, ids, generate, device)  # warm-up
                        runs = [transformers_generation(torch, model, ids, generate, device)[:3] for _ in range(repeats)]
                    results[(name, impl, b)] = best(runs, b, prompt, generate)
                    print(f"bench model: transformers {name} {impl} B={b} done ({cache_class}): "
                          f"{results[(name, impl, b)].cells()}", file=sys.stderr, flush=True)
            notes.append(f"transformers {name}: cache {cache_class}")
        except Exception as error:  # noqa: BLE001 - a row that says why, not a lost table
            why = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
            for impl in TRANSFORMERS_IMPLEMENTATIONS:
                for b in batches: results.setdefault((name, impl, b), why)
            notes.append(f"transformers {name}: {why}")
        del model
        gc.collect()
        if device == "cuda": torch.cuda.empty_cache()
    return results, notes


# ---- the table ---------------------------------------------------------------------------------------

def _names(option: str | None, known: dict, what: str) -> list[str]:
    names = list(known) if option is None else [n.strip() for n in option.split(",") if n.strip()]
    for n in names:
        if n not in known: raise ValueError(f"bench model: unknown {what} {n!r} (one of {', '.join(known)})")
    return names


def run(args) -> list[str]:
    """The tables' lines (printed as they come). Reads `small`, `markdown`, `batches` and
    `repeats` as the other benchmarks do, and `configs`, `formats`, `prompt`, `generate`,
    `no_transformers` and `engine` (the serving table's batches) where given."""
    small = args.small
    known = SMALL_CONFIGS if small else CONFIGS
    names = _names(getattr(args, "configs", None) or DEFAULT_CONFIGS, known, "config")
    formats = _names(getattr(args, "formats", None), FORMATS, "format")
    batches = [int(b) for b in (args.batches or ("1,2" if small else "1,8")).split(",")]
    prompt = getattr(args, "prompt", None) or (16 if small else 512)
    generate = getattr(args, "generate", None) or (8 if small else 128)
    repeats = max(1, args.repeats)
    if generate < 4: raise ValueError("bench model: --generate must be at least 4 (the first token, two capture steps, one more)")
    dtype = dtypes.bfloat16 if is_gpu() else dtypes.float32
    dtype_name = {dtypes.bfloat16: "bf16", dtypes.float32: "fp32"}[dtype]
    # --devices N: the models split over the default device's first N instances (`models.parallel`)
    count = getattr(args, "devices", None) or 1
    devices = models.parallel.default_devices(count)
    ours = "nuvec_tg" if devices is None else f"nuvec_tg, {count} devices"

    notes: list[str] = []
    runnable = {name: known[name] for name in names}

    theirs: dict = {}
    if not getattr(args, "no_transformers", False):
        theirs, their_notes = transformers_times(runnable, batches, prompt, generate, repeats, small)
        notes += their_notes
        release_torch()

    name_of_device = device_name()
    peak = PEAK_BANDWIDTH.get(name_of_device)
    lines = [f"End-to-end greedy generation on {name_of_device} ({Device.DEFAULT}), commit {commit()}: random "
             f"weights at the configs' sizes, {prompt} random prompt tokens then {generate} generated per sequence, B "
             f"sequences; wall clock with the host included, as a user sees it, best of {repeats} after a warm-up "
             f"generation (compiles not timed). nuvec_tg: `Model.generate_tokens` (stop tokens off), its prefill and "
             f"decode phases as `last_generation` records them (greedy: the steps chained on the device, their "
             f"tokens read back in groups); decode tokens/s = B x {generate - 1} steps over the decode phase, and "
             f"ms per decode step the decode phase over its steps (the timed generations reuse the warm-up's cache "
             f"and its jitted step, as a user's next generation does). Host / device ms a step: the decode step "
             f"replayed after the generation, the host's time until a replay returns (median of 16, the device "
             f"idle) and 16 replays queued back to back over their count (the device's time a step when the host "
             f"runs ahead). transformers: bf16 "
             f"(float32 on the CPU), a manual greedy loop over the model's "
             f"cache, one forward of the prompt (last row's logits) then one per token, CUDA synchronized at every "
             f"clock read. q4: quantized at load to 4-bit affine, groups of 64."
             + (f" {ours}: split over {', '.join(devices)}, tensor parallel (`models.parallel`: each device "
                "runs the kernels on its slice, the sums across devices are tinygrad's all-reduce)." if devices else ""), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    print("\n".join(lines), flush=True)

    def emit(row: str) -> None:
        print(row, flush=True)
        lines.append(row)

    roofline, served, summed = [], [], []
    engine_batches = [int(b) for b in getattr(args, "engine", None).split(",")] if getattr(args, "engine", None) else []
    for name, config in runnable.items():
        for fmt in formats:
            label = dtype_name if FORMATS[fmt] is None else f"{dtype_name} q4"
            began = time.perf_counter()
            model = models.random_model(config, dtype=dtype, quantize=FORMATS[fmt], devices=devices)
            made = time.perf_counter() - began
            logit = largest_logit(model, prompt, generate)
            notes.append(f"{name} {label}: made in {made:.1f} s; max |logit| of a {prompt}-token prefill {logit:.2f}"
                         + (" (NOT FINITE)" if not np.isfinite(logit) else ""))
            everything, read = weight_bytes(model)
            for b in batches:
                timing, warm = time_ours(model, b, prompt, generate, repeats)
                notes.append(f"{name} {label} B={b}: warm-up generation {warm:.1f} s")
                emit(f"| {name} | {ours} | {label} | {b} | " + timing.cells())
                step_bytes = read + cache_bytes_per_step(model, b, prompt, generate)
                step_s = timing.split[1]
                rate = step_bytes / step_s
                share = f"{100 * rate / (peak * count):.0f}%" if peak else "-"   # every device's bandwidth
                roofline.append(f"| {name} | {label} | {b} | {everything / 1e9:.4g} | {step_bytes / 1e9:.4g} | "
                                f"{step_s * 1e3:.2f} | {rate / 1e12:.2f} | {share} |")
                if devices:
                    sums_s, (hidden_sums, head_sums) = all_reduce_step(model, b), device_sums(model)
                    summed.append(f"| {name} | {label} | {b} | {hidden_sums} + {head_sums} | {sums_s * 1e3:.3f} | "
                                  f"{100 * sums_s / step_s:.0f}% |")
            for b in engine_batches:
                run = time_engine(model, b, prompt, generate, repeats)
                served.append(f"| {name} | {label} | {b} | " + run.cells())
                print(served[-1], flush=True)
            del model
            gc.collect()
        for impl in TRANSFORMERS_IMPLEMENTATIONS:
            stack = f"transformers {'SDPA' if impl == 'sdpa' else impl}"
            for b in batches:
                got = theirs.get((name, impl, b), "not run (--no-transformers)")
                their_label = "bf16" if is_gpu() or got == "not installed" else dtype_name
                if isinstance(got, Timing): emit(f"| {name} | {stack} | {their_label} | {b} | " + got.cells())
                else: emit(f"| {name} | {stack} | {their_label} | {b} | {got} | - | - | - |")

    head = ["config", "dtype/quant", "B", "weights GB", "read per step GB", "device ms per step", "TB/s", "% of peak"]
    tail = ["", f"Decode steps against the memory roofline (peak {'%.1f TB/s' % (peak / 1e12) if peak else 'unknown'}): "
            "a step reads the weights (all but the embedding table, unless it is the head) and the cache (K/V rows "
            f"at the decode's mean position, {prompt} + {generate}/2; recurrent state read and written); TB/s = "
            "those bytes over the step's device time (host / device ms a step's second).", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *roofline]
    if summed:
        head = ["config", "dtype/quant", "B", "sums a step (hidden + head)", "ms a step, the sums alone", "of the step's device ms"]
        tail += ["", f"The sums across the {count} devices (`--devices`): a decode step's all-reduces (`layers.all_reduce`, "
                 "tinygrad's), of `[B, 1, hidden]` after each attention and MLP and of `[B, 1, vocab]` for the head split "
                 "by vocabulary, chained alone in one jitted function and timed over 16 replays (device time; within a "
                 "step they wait on the kernels around them too).", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *summed]
    if served:
        head = ["config", "dtype/quant", "B", "prompt tokens", "total s", "generated tokens/s", "s to every first token",
                "ms a step, all decoding", "tokens/s, all decoding"]
        tail += ["", f"Serving (`models.Engine`, `--engine`): B requests submitted at once, prompts of lengths spread "
                 f"evenly from {max(prompt // 2, 1)} to {prompt} tokens, {generate} greedy tokens each, continuous batching "
                 "over the paged cache (a prompt chunk of up to 512 tokens a step between batched decode steps, tokens "
                 "read back every step); best total of the repeats after a warm-up run on the same engine. The last "
                 "two columns: the median step while every request decodes (no prefill in it).", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *served]
    tail += ["", *[f"- {note}" for note in notes]]
    print("\n".join(tail), flush=True)
    return lines + tail


__all__ = ["run", "CONFIGS", "SMALL_CONFIGS", "FORMATS"]

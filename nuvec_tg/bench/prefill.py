"""Prefill attention (`python -m nuvec_tg.bench prefill`): causal and windowed self-attention over
whole prompts, nuvec_tg's tiled kernel beside PyTorch's default `scaled_dot_product_attention`, its
flash backend alone (causal rows; windowed rows: PyTorch's SDPA under the band as a boolean mask,
the way a user asks it for a window) and tinygrad's own `Tensor.scaled_dot_product_attention`
where its scores fit. TFLOP/s count the products over the visible (query, key) pairs only:
`2 * B * Hq * pairs * (D + Dv)`.

PyTorch is timed as eager calls between CUDA events (a prefill call is long beside its launch; its
cuDNN backend, part of the default's choice, fails under CUDA graph capture on some shapes), ours
and tinygrad's as TinyJit replays, each on the device."""
from __future__ import annotations

import numpy as np
from tinygrad import Device, Tensor, dtypes

from .. import fast
from .common import commit, cuda_torch, device_name, part_of, release_torch, time_jit, warm_up_torch

PEAK_BF16_FLOPS = {"NVIDIA H200": 989e12, "NVIDIA H100 80GB HBM3": 989e12}  # dense, the datasheet's
WINDOW = 1024
SETS = 3  # distinct (q, k, v) sets a replay takes in turn


def visible_pairs(lq: int, lk: int, window: int | None) -> int:
    """(query, key) pairs a causal (lower-right aligned) call attends, within `window` when given."""
    rows = np.arange(lq) + lk - lq                        # each query's last key
    first = np.zeros(lq) if window is None else np.maximum(rows - window + 1, 0)
    return int(np.clip(rows + 1 - first, 0, None).sum())


def flops(b: int, hq: int, lq: int, lk: int, d: int, dv: int, window: int | None) -> int:
    return 2 * b * hq * visible_pairs(lq, lk, window) * (d + dv)


def torch_seconds(b, hq, hkv, length, d, window, backend: str, repeats: int) -> float | None:
    """PyTorch's seconds per call: `backend` "default" (its own choice), "flash" (that backend
    only; causal rows), "masked" (the default under a boolean band mask). None without PyTorch, or
    where the backend refuses the call."""
    torch = cuda_torch()
    if torch is None: return None
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sets = [tuple(torch.randn(b, h, length, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
            for _ in range(SETS)]
    options = dict(enable_gqa=hq != hkv)
    if backend == "masked":
        position = torch.arange(length, device="cuda")
        band = (position[None, :] <= position[:, None]) & (position[None, :] > position[:, None] - window)
        options["attn_mask"] = band
    else:
        options["is_causal"] = True
    def call(q, k, v):
        if backend != "flash": return F.scaled_dot_product_attention(q, k, v, **options)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]): return F.scaled_dot_product_attention(q, k, v, **options)
    try:
        for q, k, v in sets: call(q, k, v)
        torch.cuda.synchronize()
    except RuntimeError:
        return None
    warm_up_torch()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for q, k, v in sets: call(q, k, v)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / SETS)
    del sets
    torch.cuda.empty_cache()
    return best


def grid(args) -> list[tuple]:
    """(B, Hq, Hkv, D, L, window) rows: causal and windowed, 1k/4k/16k tokens, heads 32/8, 16/2,
    64/8, head sizes 64, 128, 256, B 1 and 4."""
    rows = [(b, hq, hkv, d, length, window) for window in (None, WINDOW) for d in (128, 64, 256)
            for hq, hkv in ((32, 8), (16, 2), (64, 8)) for length in (1024, 4096, 16384) for b in (1, 4)
            if not (window and length <= WINDOW)]
    if args.quick: rows = [r for r in rows if (r[0] == 1 and r[1:3] == (32, 8)) or (r[3] == 128 and r[4] == 4096)]
    if getattr(args, "masks", None):
        wanted = set(args.masks.split(","))
        rows = [r for r in rows if ("window" if r[5] else "causal") in wanted]
    if args.small: rows = [(1, 4, 2, 64, 40, None)]
    return part_of(rows, args.part, args.batches)


def run(args) -> list[str]:
    """The table's lines (printed as they come)."""
    rows = grid(args)
    torch_cells = {row: {kind: torch_seconds(*row[:3], row[4], row[3], row[5], kind, args.repeats)
                         for kind in (("masked",) if row[5] else ("default", "flash"))} for row in rows}
    release_torch()
    columns = ["B", "Hq/Hkv", "D", "L", "mask", "plan", "nuvec µs", "TFLOP/s", "% peak", "tinygrad µs", "torch µs",
               "torch TFLOP/s", "torch flash µs", "vs torch"]
    name = device_name()
    peak = PEAK_BF16_FLOPS.get(name)
    lines = [f"Prefill attention (self-attention over a prompt, bfloat16) on {name} ({Device.DEFAULT}), commit {commit()}; "
             f"µs per call, the best of {args.repeats}: TinyJit replays of {SETS} calls over distinct inputs for nuvec_tg "
             f"and tinygrad, {SETS} eager calls between CUDA events for PyTorch (torch: its default SDPA, causal; under the "
             f"window's band as a boolean mask for windowed rows; torch flash: its flash backend alone); TFLOP/s over the "
             f"visible (query, key) pairs; peak {'%.0f TFLOP/s dense bf16 (datasheet)' % (peak / 1e12) if peak else 'unknown'}.",
             "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    print("\n".join(lines), flush=True)
    rng = np.random.default_rng(0)
    for row in rows:
        b, hq, hkv, d, length, window = row
        dtype = dtypes.bfloat16
        make = lambda *s: Tensor(rng.standard_normal(s, dtype=np.float32)).cast(dtype).contiguous().realize()  # noqa: E731
        sets = [(make(b, hq, length, d), make(b, hkv, length, d), make(b, hkv, length, d)) for _ in range(SETS)]
        options = dict(mask="causal", window=window)
        plan = fast.plan_attention(sets[0][0].shape, sets[0][1].shape, sets[0][2].shape, dtype, **options)
        ours = time_jit(lambda q, k, v: fast.scaled_dot_product_attention(q, k, v, d ** -0.5, **options), sets, args.repeats)
        theirs = None
        # tinygrad materialises every score: only where they fit 4 GiB (and not under --no-tinygrad)
        if b * hq * length * length * 4 <= 4 << 30 and window is None and not getattr(args, "no_tinygrad", False):
            theirs = time_jit(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True, enable_gqa=hq != hkv),
                              sets, max(2, args.repeats // 2))
        work = flops(b, hq, length, length, d, d, window)
        cells = torch_cells[row]
        torch_s = cells.get("masked") or cells.get("default")
        flash = cells.get("flash")
        kernel = plan.kernel
        plan_text = type(kernel).__name__
        if isinstance(kernel, fast.Tiled):  # SIMD groups x rows each / keys; wgmma: warpgroups x 64 / keys
            plan_text += (f" wgmma {kernel.warps // 4}x64/{kernel.keys}" if kernel.wgmma_stages else
                          f" {kernel.warps}x{kernel.row_tiles * 16}/{kernel.keys}")
        share = f"{100 * work / ours / peak:.0f}%" if peak else "-"
        line = (f"| {b} | {hq}/{hkv} | {d} | {length} | {'window ' + str(window) if window else 'causal'} | {plan_text} | "
                f"{ours * 1e6:.1f} | {work / ours / 1e12:.0f} | {share} | "
                + (f"{theirs * 1e6:.0f} |" if theirs else "- |")
                + (f" {torch_s * 1e6:.1f} | {work / torch_s / 1e12:.0f} |" if torch_s else " - | - |")
                + (f" {flash * 1e6:.1f} |" if flash else " - |")
                + (f" {torch_s / ours:.2f}x |" if torch_s else " - |"))
        print(line, flush=True)
        lines.append(line)
        del sets
    return lines

"""Time the same calls with two versions of the kernel sources, interleaved in one process, and
compare their outputs bit for bit (the method behind `benchmarks/gated_delta_h200.md`'s "what
moved it" table: machines drift 5-15% between calls, so an A/B is only read within one).

    DEV=CUDA python3 tools/ab_sources.py --base REV_OR_DIR [--case gated_delta] [--rounds 2]
    python3 tools/ab_sources.py --extract REV DIR      copy REV's `nuvec_tg/kernels/src` into DIR

`--base`: a directory holding another version of `nuvec_tg/kernels/src` (e.g. made here by
`--extract` and carried to the GPU machine, which gets the working tree without git's history),
or a git revision (extracted to a temporary directory). The other side is the working tree's
sources. Only the kernel sources change between the sides (`program.SOURCE_DIR`): a change in the
Python launch code (a plan, a define's value) is the same on both. Each (case, size) prints the
best-of-3 TinyJit device time of each side per round, and whether the two sides' outputs are
equal bit for bit (they should be, for a change meant to leave the arithmetic alone).

Cases (`CASES`): `gated_delta`: the chunked prefill as the plan routes it, both passes, at
Qwen3.5-9B's sizes (Hk 16, Hv 32, Dk = Dv = 128; bf16 q/k/v, float32 g, beta and state) for (B,
T) in (1, 2048), (1, 8192), (8, 2048).

`--emulated` (no GPU: a C++ compiler, as the emulated tests use): instead of timing, run the
case's emulated tests' inputs (`tests/test_gated_delta_emulated.py`'s chunked cases, or those
named by `--only`) through the CUDA rendering on the CPU with each side's sources and compare the
outputs bit for bit: a refactor meant to leave the arithmetic alone shows here before a GPU does.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Callable

import numpy as np

SOURCES = "nuvec_tg/kernels/src"
REPOSITORY = Path(__file__).resolve().parents[1]


def extract(revision: str, into: Path) -> Path:
    """REV's kernel sources (`git archive`) as files in `into`; returns `into`."""
    archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", revision, SOURCES], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                (into / Path(member.name).name).write_bytes(tar.extractfile(member).read())
    return into


def base_sources(base: str) -> Path:
    """`--base` as a directory of sources: given as one, or extracted from a git revision."""
    path = Path(base)
    if path.is_dir(): return path.resolve()
    return extract(base, Path(tempfile.mkdtemp()) / "src")


def gated_delta_case():
    """(label, calls, run) per size of the `gated_delta` case; run(call) -> outputs to compare."""
    from tinygrad import Device, Tensor, dtypes

    from nuvec_tg.kernels import gated_delta as kernel
    from nuvec_tg.kernels import kernel_backend
    backend = kernel_backend(Device.DEFAULT)
    for b, t in ((1, 2048), (1, 8192), (8, 2048)):
        q = (Tensor.rand(b, t, 16, 128) - 0.5).cast(dtypes.bfloat16).contiguous().realize()
        k = (Tensor.rand(b, t, 16, 128) * 0.1).cast(dtypes.bfloat16).contiguous().realize()
        v = (Tensor.rand(b, t, 32, 128) - 0.5).cast(dtypes.bfloat16).contiguous().realize()
        g = (Tensor.rand(b, t, 32) * 0.1 + 0.9).contiguous().realize()
        beta = Tensor.rand(b, t, 32).contiguous().realize()
        state = Tensor.zeros(b, 32, 128, 128).contiguous().realize()

        def run(*call):
            return kernel.gated_delta_kernel(*call, backend=backend)
        yield f"B {b} T {t}", [(q, k, v, g, beta, state)], run


def gated_delta_emulated(only: list[str] | None):
    """(name, run) per chunked case of the emulated tests; run() -> the outputs by name."""
    sys.path.insert(0, str(REPOSITORY / "tests"))
    import test_gated_delta_emulated as emulated
    for name, case in emulated.CHUNKED_CASES.items():
        if only and name not in only: continue
        arrays, _ = emulated.chunked_inputs(name, case)
        yield name, lambda case=case, arrays=arrays: emulated.emulated_chunked(case, arrays)


CASES: dict[str, Callable] = {"gated_delta": gated_delta_case}
EMULATED: dict[str, Callable] = {"gated_delta": gated_delta_emulated}


def use_sources(sources: Path) -> None:
    """Make the programs built from here on read their kernel sources from `sources`."""
    from nuvec_tg.kernels import program
    program.SOURCE_DIR = sources
    program._source.cache_clear()


def compare_emulated(case: str, base: Path, only: list[str] | None = None) -> dict[str, bool]:
    """Each emulated input's outputs under `base`'s sources and the working tree's: equal bit for bit?"""
    from nuvec_tg.kernels import program
    tree = program.SOURCE_DIR
    same = {}
    try:
        for name, run in EMULATED[case](only):
            outputs = {}
            for side, sources in (("base", base), ("tree", tree)):
                use_sources(sources)
                outputs[side] = run()
            same[name] = all(np.array_equal(outputs["base"][key], outputs["tree"][key], equal_nan=True) for key in outputs["tree"])
    finally:
        use_sources(tree)
    return same


def bits(tensor) -> np.ndarray:
    """A tensor's elements as unsigned integers of its width (equal arrays: equal bits)."""
    from tinygrad import dtypes
    return tensor.bitcast({2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[tensor.dtype.itemsize]).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="the other side's kernel sources: a directory or a git revision")
    parser.add_argument("--extract", nargs=2, metavar=("REV", "DIR"), help="copy REV's kernel sources into DIR and exit")
    parser.add_argument("--case", choices=list(CASES), default="gated_delta")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of (base, working tree)")
    parser.add_argument("--emulated", action="store_true", help="compare the emulated kernels' outputs on the CPU instead of timing")
    parser.add_argument("--only", nargs="*", help="with --emulated: these emulated cases only")
    args = parser.parse_args()
    if args.extract:
        print(extract(args.extract[0], Path(args.extract[1])))
        return
    if args.base is None: parser.error("--base or --extract is required")
    if args.emulated:
        same = compare_emulated(args.case, base_sources(args.base), args.only)
        for name, equal in same.items(): print(f"{name}: outputs equal bit for bit: {equal}", flush=True)
        sys.exit(0 if same and all(same.values()) else 1)

    from tinygrad import Device

    from nuvec_tg.bench.common import time_jit
    from nuvec_tg.kernels import kernel_backend
    from nuvec_tg.kernels import program
    if kernel_backend(Device.DEFAULT) is None:
        sys.exit(f"ab_sources: needs a GPU with nuvec_tg's kernels (DEV=CUDA or DEV=METAL), not {Device.DEFAULT}")
    sides = {"base": base_sources(args.base), "tree": program.SOURCE_DIR}
    try:
        for label, calls, run in CASES[args.case]():
            cells, outputs = [], {}
            for _ in range(args.rounds):
                for side, sources in sides.items():
                    use_sources(sources)
                    cells.append(f"{side} {time_jit(run, calls, 3) * 1e6:.1f}")
            for side, sources in sides.items():
                use_sources(sources)
                result = run(*calls[0])
                outputs[side] = [bits(t) for t in (result if isinstance(result, tuple) else (result,))]
            same = all(np.array_equal(a, b) for a, b in zip(outputs["base"], outputs["tree"]))
            print(f"{label}: " + " | ".join(cells) + f" | outputs equal bit for bit: {same}", flush=True)
    finally:
        use_sources(sides["tree"])


if __name__ == "__main__":
    main()

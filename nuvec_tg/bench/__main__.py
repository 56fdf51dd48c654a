"""`python -m nuvec_tg.bench {attention,prefill,gated_delta,linear,quant,rows} [--quick] [--small] [--repeats N]
[--markdown FILE] [--part I/N] [--batches B,...] [--ops OP,...]`: nuvec_tg's hot paths on the default device
beside tinygrad's compositions and PyTorch's (or flash-linear-attention's) kernels, each timed on
the device, as a markdown table (see each module's docstring for what it measures).

`python -m nuvec_tg.bench model [--small] [--markdown FILE] [--configs qwen3_8b,qwen3_5_9b]
[--formats dense,q4] [--batches 1,8] [--prompt 512] [--generate 128] [--repeats N]
[--no-transformers]`: whole models' generation at real sizes with random weights, wall clock,
beside transformers' (`bench/model.py`).

The grids are meant for a GPU with nuvec_tg's kernels (METAL, CUDA); on another device, such as
the CPU, the benchmark runs its `--small` shapes."""
from __future__ import annotations

import argparse
import sys

from tinygrad import Device

from ..kernels import kernel_backend
from . import attention, gated_delta, linear, model, prefill, quant, rows

BENCHMARKS = {"attention": attention.run, "prefill": prefill.run, "gated_delta": gated_delta.run, "linear": linear.run,
              "quant": quant.run,
              "rows": rows.run, "model": model.run}
# timed repeats of each measurement, unless --repeats says: a model's are whole generations
DEFAULT_REPEATS = {"model": 3}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m nuvec_tg.bench", description=__doc__)
    parser.add_argument("what", choices=list(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--small", action="store_true", help="tiny shapes, to check the benchmark itself (CPU)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 10; model: 3 generations)")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--part", default="1/1", help="I/N: only the I-th of N interleaved slices of the grid "
                        "(to spread a long grid over several device calls)")
    parser.add_argument("--batches", help="B,...: only these batch sizes (attention, gated_delta, model (default 1,8); "
                        "quant, linear: these rows M; rows: these row counts, 4096 or 32)")
    parser.add_argument("--ops", help=f"rows: these operations only (of {', '.join(rows.OPS)})")
    parser.add_argument("--configs", help=f"model: these configs only (of {', '.join(model.CONFIGS)})")
    parser.add_argument("--formats", help=f"model: these formats only (of {', '.join(model.FORMATS)}: bfloat16, "
                        "and quantized at load to 4-bit affine)")
    parser.add_argument("--prompt", type=int, help="model: prompt tokens a sequence (default 512)")
    parser.add_argument("--generate", type=int, help="model: tokens generated a sequence (default 128)")
    parser.add_argument("--no-transformers", action="store_true", help="model: without transformers' rows")
    parser.add_argument("--no-moe", action="store_true", help="quant: without the MoE prefill rows")
    parser.add_argument("--no-tinygrad", action="store_true", help="prefill: without tinygrad's attention column")
    parser.add_argument("--masks", help="prefill: causal,window: only these rows (default both)")
    parser.add_argument("--devices", type=int, help="model: split the models over this many of the default device's "
                        "instances (tensor parallel)")
    parser.add_argument("--engine", help="model: B,...: also the serving table (models.Engine, prompts of different lengths)")
    args = parser.parse_args()
    if args.repeats is None: args.repeats = DEFAULT_REPEATS.get(args.what, 10)
    if not args.small and kernel_backend(Device.DEFAULT) is None:  # elsewhere the GPU grid would run for hours
        print(f"bench: the {args.what} grid is meant for a GPU with nuvec_tg's kernels (METAL, CUDA), not "
              f"{Device.DEFAULT}: running its --small shapes instead", file=sys.stderr)
        args.small = True
    lines = BENCHMARKS[args.what](args)
    if args.markdown:
        with open(args.markdown, "w") as f: f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())

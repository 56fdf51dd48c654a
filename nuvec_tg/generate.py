"""Generate text from a checkpoint directory, streaming it as it comes.

    python -m nuvec_tg.generate --model DIR --prompt "..." [--max-tokens N] [--temperature T]
        [--top-p P] [--top-k K] [--seed S] [--quantize 4|8|mxfp4|...] [--dtype float16] [--chat]

Prints the text, then the prompt's and the generation's tokens per second and the device.
Needs the optional `tokenizers` (and for --chat `jinja2`) packages: pip install 'nuvec-tg[models]'.
"""
from __future__ import annotations

import argparse

from tinygrad import Device


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nuvec_tg.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory (Hugging Face or MLX layout)")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantize", default=None, help="quantize at load: 4 or 8 (affine), mxfp4, mxfp8 or nvfp4")
    parser.add_argument("--dtype", default=None, choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template as a user message")
    parser.add_argument("--devices", type=int, default=1,
                        help="split the model over this many of the default device's instances (tensor parallel)")
    args = parser.parse_args(argv)
    if args.devices < 1: parser.error("--devices must be at least 1")

    from . import models
    quantize = int(args.quantize) if args.quantize is not None and args.quantize.isdigit() else args.quantize
    model = models.load(args.model, dtype=args.dtype, quantize=quantize, devices=models.parallel.default_devices(args.devices))
    for piece in model.generate(args.prompt, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, chat=args.chat):
        print(piece, end="", flush=True)
    stats = model.last_generation
    print()
    print(f"prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.1f} tokens/s")
    print(f"generation: {stats.generated_tokens} tokens, {stats.generation_tps:.1f} tokens/s")
    label = "devices" if isinstance(stats.device, tuple) else "device"
    print(f"{label}: {models.device_description(stats.device or Device.DEFAULT)}")


if __name__ == "__main__":
    main()

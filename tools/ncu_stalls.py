"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's warp-state sampling.

On the GPU machine (ncu is there; see the device tool's H200.md):

    ncu --clock-control none -k regex:NAME --launch-count 1 --section SourceCounters \\
        --section WarpStateStats -o report python3 script.py
    ncu --import report.ncu-rep --page source --csv --print-source sass -k regex:NAME > source.csv

then, anywhere: `python3 tools/ncu_stalls.py source.csv [--top 25]`. It prints the share of every
stall reason over the kernel's samples and the instructions that hold the most samples, each with
its two largest reasons. This is how the chunked gated delta pass's u widening was found
(`benchmarks/gated_delta_h200.md`): 41% of its samples on three instructions waiting on loads
("long scoreboard") meant to be a chunk ahead.
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter
from dataclasses import dataclass

SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclass
class Instruction:
    address: str
    source: str
    samples: float
    stalls: dict[str, float]   # reason (without "stall_") -> samples


def number(text: str) -> float:
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def read(path: str) -> tuple[str, list[Instruction]]:
    """The kernel's name and its instructions from ncu's `--page source --csv` output (a line
    naming the kernel, then a header, then a row per instruction)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next((i for i, row in enumerate(rows) if "Address" in row and "Source" in row), None)
    if start is None: raise SystemExit(f"ncu_stalls: {path} has no 'Address' / 'Source' header: not ncu's source page")
    name = next((row[1] for row in rows[:start] if len(row) > 1 and row[0] == "Kernel Name"), "?")
    header = rows[start]
    column = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    instructions = []
    for row in rows[start + 1:]:
        if len(row) < len(header): continue
        stalls = {r[len("stall_"):]: number(row[column[r]]) for r in reasons}
        samples = number(row[column[SAMPLES]]) if SAMPLES in column else sum(stalls.values())
        instructions.append(Instruction(row[column["Address"]], row[column["Source"]].strip(), samples, stalls))
    return name, instructions


def report(name: str, instructions: list[Instruction], top: int) -> list[str]:
    totals: Counter[str] = Counter()
    for ins in instructions:
        totals.update(ins.stalls)
    total = sum(totals.values())
    lines = [f"{name}: {len(instructions)} instructions, {total:.0f} stall samples"]
    if total == 0: return lines + ["no samples (was the SourceCounters section collected?)"]
    lines += [f"  {reason:22s} {count / total:6.1%}" for reason, count in totals.most_common() if count > 0]
    lines.append(f"the {top} instructions with the most samples (share of all; their two largest reasons):")
    for ins in sorted(instructions, key=lambda i: -i.samples)[:top]:
        reasons = sorted(ins.stalls.items(), key=lambda kv: -kv[1])[:2]
        said = ", ".join(f"{r} {v / max(ins.samples, 1):.0%}" for r, v in reasons if v > 0)
        lines.append(f"  {ins.samples / total:6.1%}  {ins.source[:64]:64s}  {said}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=25, help="instructions to list")
    args = parser.parse_args()
    print("\n".join(report(*read(args.csv), args.top)))


if __name__ == "__main__":
    main()

"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's warp-state sampling.

On the GPU machine (ncu is there; see the device tool's H200.md):

    ncu --clock-control none -k regex:NAME --launch-count 1 --section SourceCounters \\
        --section WarpStateStats -o report python3 script.py
    ncu --import report.ncu-rep --page source --csv --print-source sass -k regex:NAME > source.csv

then, anywhere: `python3 tools/ncu_stalls.py source.csv [--top 25] [--roles 4]`. It prints the
share of every stall reason over the kernel's samples and the instructions that hold the most
samples, each with its two largest reasons; `--roles N`, the N sets of instructions executed the
same number of times that hold the most samples, each with its own reasons (a warp-specialised
kernel's producer and consumer loops fall apart so: `quant_h200.md`, qmm_wgmma_ws); and, where
the page has them (`--section MemoryWorkloadAnalysis` too), the L1 tag lookups of global memory
by opcode: one a 128-byte line an instruction touches. This is how the chunked gated delta pass's u widening was found
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
    executed: float = 0.0      # warp-level executions ("Instructions Executed")
    tags: float = 0.0          # L1 tag lookups of global memory ("L1 Tag Requests Global")

    @property
    def opcode(self) -> str:
        words = self.source.split()
        words = words[1:] if words and words[0].startswith("@") else words   # a predicate
        return words[0] if words else "?"


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
        optional = lambda title: number(row[column[title]]) if title in column else 0.0  # noqa: E731
        instructions.append(Instruction(row[column["Address"]], row[column["Source"]].strip(), samples, stalls,
                                        optional("Instructions Executed"), optional("L1 Tag Requests Global")))
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


def roles(instructions: list[Instruction], count: int) -> list[str]:
    """The `count` sets of instructions executed equally often with the most samples: a loop of
    one kind of warp each (its instructions, executions, share of the samples, top reasons)."""
    groups: dict[float, list[Instruction]] = {}
    for ins in instructions:
        if ins.executed: groups.setdefault(ins.executed, []).append(ins)
    total = sum(ins.samples for ins in instructions) or 1.0
    lines = [f"the {count} sets of instructions executed equally often with the most samples:"]
    for executed, members in sorted(groups.items(), key=lambda kv: -sum(i.samples for i in kv[1]))[:count]:
        stalls: Counter[str] = Counter()
        for ins in members: stalls.update(ins.stalls)
        samples = sum(stalls.values()) or 1.0
        said = ", ".join(f"{r} {v / samples:.0%}" for r, v in stalls.most_common(4) if v > 0)
        lines.append(f"  {len(members):5d} instructions x {executed:.0f}: {sum(i.samples for i in members) / total:6.1%}  {said}")
    return lines


def tag_lookups(instructions: list[Instruction]) -> list[str]:
    """The L1 tag lookups of global memory by opcode, most first (none: the page lacks them)."""
    by_opcode: Counter[str] = Counter()
    for ins in instructions:
        if ins.tags: by_opcode[ins.opcode] += ins.tags
    total = sum(by_opcode.values())
    if not total: return []
    return [f"L1 tag lookups of global memory: {total:.0f}"] + \
        [f"  {opcode:28s} {lookups:14.0f} {lookups / total:6.1%}" for opcode, lookups in by_opcode.most_common()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=25, help="instructions to list")
    parser.add_argument("--roles", type=int, default=0, help="sets of equally often executed instructions to list")
    args = parser.parse_args()
    name, instructions = read(args.csv)
    lines = report(name, instructions, args.top)
    if args.roles: lines += roles(instructions, args.roles)
    print("\n".join(lines + tag_lookups(instructions)))


if __name__ == "__main__":
    main()

"""Compile every CUDA specialisation the plan can emit, family by family, before anything runs
them (`tests/kernel_specialisations.py` says which: a covering set of the plan's walk, `--full`
every distinct program of it).

    python tools/compile_cuda.py --list                  each specialisation (family, program, label); no compiler
    python tools/compile_cuda.py [--arch sm_90]          nvrtc, as tinygrad compiles them (the GPU machine)
    python tools/compile_cuda.py --nvcc [--grid]         nvcc with ptxas -v: registers and local memory (no GPU)
    python tools/compile_cuda.py --ptxas                 nvrtc's PTX through ptxas -v: the same, and serialized wgmma (no GPU)
    CUOBJDUMP=... python tools/compile_cuda.py --sass    qmv's and qmv_mma's main-loop SASS instructions (no GPU)

`--family STEM` (repeatable, e.g. `nuvec_qmv`) limits `--list`, nvrtc and `--nvcc` to those families.

nvrtc (`scripts/device_check.sh` runs it before the GPU tests): each program's whole source
(what `launch` compiles: the prelude and the text) through tinygrad's `NVRTCCompiler` with tinygrad's
options, for the CUDA device's architecture (or `--arch` where no device opens), fetched as a
cubin so that the inline PTX is assembled too (as the driver does when a launch loads the PTX);
where a CUDA device opens, each cubin is loaded and its registers, local and static threadgroup
memory read. One line per family with the count compiled; the first error prints the
specialisation and the compiler's log and exits 1.

nvcc: the specialisations in a few translation units for sm_90 (`-Xptxas -v`), registers, stack and
spills per specialisation; exits 1 on an error or where a specialisation uses local memory.
`--ptxas` reads the same through nvrtc's PTX (tinygrad's options) and the ptxas on PATH, without
nvcc's headers, and also exits 1 where ptxas serializes a program's warpgroup products (its
advisory C7513: an instruction redefines an operand register of a running wgmma, so every wgmma
waits for the one before). With
`--grid`, instead, every qmv kernel `tools/tune_qmv.py` sweeps. `--sass`: the main loop's SASS
instruction counts of qmv's default plans at 1 and 8 rows and of qmv_mma's at 8 (nvrtc's PTX through ptxas, then
cuobjdump, which needs nvdisasm on PATH).
"""
from __future__ import annotations

import argparse
import dataclasses
import concurrent.futures
import itertools
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from tinygrad import dtypes

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from kernel_specialisations import Specialisation, specialisations, translation_unit  # noqa: E402

from nuvec_tg.kernels import quant as qmv  # noqa: E402
from nuvec_tg.kernels.program import Program  # noqa: E402


def chosen(families: list[str] | None, full: bool = False) -> dict[str, tuple[Specialisation, ...]]:
    """The specialisations per family stem, only `families` where given (an unknown one raises)."""
    every = specialisations("cuda", full)
    unknown = set(families or ()) - set(every)
    if unknown: raise ValueError(f"compile_cuda: unknown families {sorted(unknown)} (CUDA's: {', '.join(every)})")
    return {family: items for family, items in every.items() if not families or family in families}


def list_specialisations(by_family: dict[str, tuple[Specialisation, ...]]) -> None:
    """Print each specialisation (family, program name, label), then each family's count."""
    for items in by_family.values():
        for item in items: print(f"{item.family}\t{item.program.name}\t{item.label}")
    for family, items in by_family.items(): print(f"{family}: {len(items)} specialisations")


def compile_nvrtc(by_family: dict[str, tuple[Specialisation, ...]], arch: str | None, jobs: int) -> int:
    """Compile each specialisation with nvrtc (`jobs` at a time), family by family; load and
    measure each where a CUDA device opens. 0, or 1 at the first error."""
    from tinygrad.runtime.support.compiler_cuda import NVRTCCompiler
    device = _cuda_device()
    arch = arch or (device.arch if device is not None else "sm_90")
    compiler = NVRTCCompiler(arch, ptx=False)  # tinygrad's options; the cubin, so that the PTX is assembled as well
    compilers = {own: NVRTCCompiler(own, ptx=False) for own in {item.program.arch for items in by_family.values() for item in items}
                 if own is not None}
    compilers[arch] = compiler
    print(f"nvrtc {' '.join(compiler.compile_options)}; " + (f"loading into {device.device}" if device is not None else
                                                             "no CUDA device opened: compiled only"), flush=True)

    def compile_one(program: Program) -> bytes:
        """A program built for an architecture of its own (`Program.arch`: sm_90a) by a compiler for it."""
        return compilers[program.arch or arch].compile(program.source)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:  # nvrtc is thread-safe and ctypes releases the GIL
        for family, items in by_family.items():
            futures = [pool.submit(compile_one, item.program) for item in items]
            measured = []
            for item, future in zip(items, futures):
                try:
                    cubin = future.result()
                    if device is not None: measured.append(_load(device, item.program, cubin))
                except Exception as error:  # noqa: BLE001 - a compile or load error of any kind stops the check
                    for rest in futures: rest.cancel()
                    print(f"FAILED {family}: {item.label} ({item.program.name})\n{error}", flush=True)
                    return 1
            summary = ""
            if measured:
                registers, local, shared = (max(m[i] for m in measured) for i in range(3))
                spilling = sum(m[1] > 0 for m in measured)
                summary = (f"; at most {registers} registers, {shared} bytes of static threadgroup memory, "
                           f"{spilling} with local memory (at most {local} bytes)")
            arches = sorted({item.program.arch or arch for item in items})
            print(f"{family}: {len(items)} compiled ({', '.join(arches)}){summary}", flush=True)
    return 0


def _cuda_device():
    """The CUDA device, or None where none opens."""
    try:
        from tinygrad import Device
        return Device["CUDA"]
    except Exception:  # noqa: BLE001 - any failure to open means no device
        return None


def _load(device, program: Program, cubin: bytes) -> tuple[int, int, int]:
    """Load `cubin` on `device` and read its kernel's registers, local memory and static
    threadgroup memory (bytes); raises where the driver refuses it."""
    import ctypes
    from tinygrad.runtime.autogen import cuda
    module, function = cuda.CUmodule(), cuda.CUfunction()
    if (status := cuda.cuCtxSetCurrent(device.context)) != 0: raise RuntimeError(f"cuCtxSetCurrent: status {status}")
    if (status := cuda.cuModuleLoadData(ctypes.byref(module), cubin)) != 0:
        raise RuntimeError(f"loading the cubin failed: {cuda.enum_cudaError_enum.get(status, status)}")
    try:
        if (status := cuda.cuModuleGetFunction(ctypes.byref(function), module, program.name.encode())) != 0:
            raise RuntimeError(f"the module has no {program.name}: {cuda.enum_cudaError_enum.get(status, status)}")
        values = []
        for attribute in (cuda.CU_FUNC_ATTRIBUTE_NUM_REGS, cuda.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                          cuda.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES):
            value = ctypes.c_int32()
            cuda.cuFuncGetAttribute(ctypes.byref(value), attribute, function)
            values.append(value.value)
        return values[0], values[1], values[2]
    finally:
        cuda.cuModuleUnload(module)


# Families whose stack frame is expected, and why (spills are never).
SINCOSF_FRAME = ("CUDA's sincosf reduces angles past 105615 radians (Payne-Hanek) through a 28-byte local array: only "
                 "lanes with such angles touch it, and the full-precision sine and cosine at large positions need it")
STACK_ALLOWED = {"nuvec_rope": SINCOSF_FRAME, "nuvec_norm_rope": SINCOSF_FRAME}
# Spills allowed, by family, for the specialisations whose label matches, and why.
SPILLS_ALLOWED = {
    "nuvec_sdpa_prefill": (re.compile(r" D(192|256)/"),
                           "heads of 192 and 256 hold a 16-row tile's output (DV / 2 floats a lane) beside Q's fragments or "
                           "the score tile: at most about 80 bytes spill, and the H200 sweep measured the launch 1.7x faster "
                           "than the one that does not spill (benchmarks/prefill_h200.md)"),
    "nuvec_sdpa_prefill_wgmma": (re.compile(r"additive mask"),
                                 "an additive mask's addressing beside the scores and the output: 8-28 bytes spill at 255 "
                                 "registers; the mask is read an element at a time anyway"),
}


def local_memory_refused(item: Specialisation, stack: int, spill: int) -> bool:
    """Whether a specialisation's stack frame or spills break the rules of STACK_ALLOWED and SPILLS_ALLOWED."""
    spill_allowed = item.family in SPILLS_ALLOWED and SPILLS_ALLOWED[item.family][0].search(item.label)
    return not spill_allowed and ((stack > 0 and item.family not in STACK_ALLOWED) or spill > 0)


def print_allowances(items: list[Specialisation]) -> None:
    for family in sorted({item.family for item in items} & set(STACK_ALLOWED)):
        print(f"{family}: a stack frame allowed ({STACK_ALLOWED[family]})")
    for family in sorted({item.family for item in items} & set(SPILLS_ALLOWED)):
        print(f"{family}: spills allowed where the label matches {SPILLS_ALLOWED[family][0].pattern!r} "
              f"({SPILLS_ALLOWED[family][1]})")


def compile_ptxas(items: list[Specialisation], arch: str, jobs: int) -> int:
    """nvrtc's PTX of each specialisation (for its own architecture, else `arch`) through `ptxas -v`:
    registers and local memory per specialisation, and whether ptxas serialized its warpgroup
    products (C7513); nonzero where one fails, uses local memory against the rules, or is serialized."""
    from tinygrad.runtime.support.compiler_cuda import NVRTCCompiler
    compilers = {own: NVRTCCompiler(own, ptx=True) for own in {item.program.arch or arch for item in items}}
    tmp = pathlib.Path(tempfile.mkdtemp())

    def assemble(index_item: tuple[int, Specialisation]) -> tuple[Specialisation, int, str]:
        index, item = index_item
        own = item.program.arch or arch
        (tmp / f"{index}.ptx").write_bytes(compilers[own].compile(item.program.source).rstrip(b"\0"))
        done = subprocess.run(["ptxas", f"-arch={own}", "-v", str(tmp / f"{index}.ptx"), "-o", str(tmp / f"{index}.cubin")],
                              capture_output=True, text=True)
        return item, done.returncode, done.stdout + done.stderr
    bad = 0
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for item, returncode, out in pool.map(assemble, enumerate(items)):
            if returncode:
                print(f"FAILED {item.family}: {item.label}\n{out[:4000]}")
                return 1
            found = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores.*?Used (\d+) registers", out, re.S)
            stack, spill, registers = (int(found.group(i)) for i in (1, 2, 3))
            serialized = "C7513" in out
            print(f"{registers:4d} registers {stack:4d} stack {spill:4d} spilled{'  SERIALIZED' if serialized else ''}  "
                  f"{item.family}: {item.label}", flush=True)
            bad += serialized or local_memory_refused(item, stack, spill)
    print_allowances(items)
    if bad: print(f"{bad} specialisations use local memory or have their warpgroup products serialized")
    return 1 if bad else 0


def compile_nvcc(items: list[Specialisation], jobs: int = os.cpu_count() or 2) -> int:
    """Compile for sm_90 in `jobs` nvcc processes; print registers and local memory (stack frame,
    spills) per specialisation; nonzero if any fails or uses local memory (a stack frame allowed
    only for the families of `STACK_ALLOWED`)."""
    chunks = [items[i::jobs * 4] for i in range(min(len(items), jobs * 4))]
    tmp = tempfile.mkdtemp()
    bad = 0
    for first in range(0, len(chunks), jobs):
        procs = []
        for j, chunk in enumerate(chunks[first:first + jobs], first):
            source = f"{tmp}/unit{j}.cu"
            pathlib.Path(source).write_text(translation_unit("cuda", [item.program for item in chunk])[0])
            # sm_90a for a unit holding a wgmma program (its code runs on sm_90 devices alone, as the program's does)
            target = "-gencode=arch=compute_90a,code=sm_90a" if any(item.program.arch for item in chunk) else "-arch=sm_90"
            command = ["nvcc", target, "-cubin", "-Xptxas", "-v", "-o", f"{tmp}/unit{j}.cubin", source]
            procs.append((chunk, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        for chunk, proc in procs:
            out = proc.communicate()[0]
            if proc.returncode:
                print(out[:4000])
                return 1
            found = {m.group(1): (int(m.group(4)), int(m.group(2)), int(m.group(3))) for m in re.finditer(
                r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) bytes spill stores.*?Used (\d+) registers",
                out, re.S)}
            for item in chunk:
                registers, stack, spill = found[item.program.name]
                print(f"{registers:4d} registers {stack:4d} stack {spill:4d} spilled  {item.family}: {item.label}", flush=True)
                bad += local_memory_refused(item, stack, spill)
    print_allowances(items)
    if bad: print(f"{bad} specialisations use local memory")
    return 1 if bad else 0


def tuned_qmv() -> list[Specialisation]:
    """Every qmv kernel tools/tune_qmv.py sweeps (bfloat16 x)."""
    from tune_qmv import FORMATS as TUNED, SHAPES, plans
    items = []
    for fmt, (k, n), rows in itertools.product(TUNED, SHAPES, (1, 4)):
        mode, group, bits = TUNED[fmt]
        scales = dtypes.bfloat16 if mode == "affine" else dtypes.uint8
        for p in plans(rows, k):
            program = qmv.qmv_program("cuda", dtypes.bfloat16, scales, dtypes.bfloat16, mode=mode, group_size=group, bits=bits,
                                      rows=rows, k=k, n=n, qmv_plan=p)
            items.append(Specialisation("nuvec_qmv", f"{fmt} M{rows} K{k} N{n} {p}", program))
    return list({item.program.name: item for item in items}.values())


def loop_histogram(program: Program, cuobjdump: str) -> tuple[int, dict[str, int]]:
    """(instructions, count per opcode) of the main loop (the longest backward branch's body) of one
    program's sm_90 SASS."""
    from tinygrad.runtime.support.compiler_cuda import NVRTCCompiler
    tmp = tempfile.mkdtemp()
    arch = program.arch or "sm_90"
    pathlib.Path(f"{tmp}/one.ptx").write_bytes(NVRTCCompiler(arch, ptx=True).compile(program.source).rstrip(b"\0"))
    subprocess.run(["ptxas", f"-arch={arch}", "-o", f"{tmp}/one.cubin", f"{tmp}/one.ptx"], check=True)
    sass = subprocess.run([cuobjdump, "-sass", f"{tmp}/one.cubin"], capture_output=True, text=True, check=True).stdout
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)
    at = {int(address, 16): i for i, (address, _) in enumerate(lines)}
    loops = [(at[int(m.group(1), 16)], i) for i, (_, text) in enumerate(lines)
             if (m := re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", text)) and int(m.group(1), 16) in at
             and at[int(m.group(1), 16)] < i]
    first, last = max(loops, key=lambda span: span[1] - span[0])
    counts: dict[str, int] = {}
    for _, text in lines[first:last + 1]:
        opcode = text.split()[1 if text.startswith("@") else 0].split(".")[0]
        counts[opcode] = counts.get(opcode, 0) + 1
    return last + 1 - first, dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def print_sass(cuobjdump: str) -> None:
    """Main-loop instruction counts of qmv's default plans at K = N = 4096, one row and eight, and
    of qmv_mma's at eight rows."""
    for (mode, group, bits), rows in itertools.product((("affine", 64, 4), ("affine", 64, 8), ("mxfp4", 32, 4)), (1, 8)):
        scales = dtypes.bfloat16 if mode == "affine" else dtypes.uint8
        p = qmv.plan(rows, 4096, 4096)
        program = qmv.qmv_program("cuda", dtypes.bfloat16, scales, dtypes.bfloat16, mode=mode, group_size=group, bits=bits,
                                  rows=rows, k=4096, n=4096, qmv_plan=p)
        count, counts = loop_histogram(program, cuobjdump)
        codes = 32 * p.columns_per_warp * p.unroll
        print(f"qmv {mode} {bits}-bit g{group} M{rows} {p}: {count} instructions per lane step of {codes} codes "
              f"({count / codes:.2f} a code): {counts}")
        if rows == 1: continue
        m = qmv.qmv_mma_plan(4096, 4096)
        program = qmv.qmv_mma_program(dtypes.bfloat16, scales, dtypes.bfloat16, mode=mode, group_size=group, bits=bits,
                                      rows=rows, k=4096, n=4096, mma_plan=m)
        # The whole-unit rounds only: the tail round's call replaced by theirs (at K 4096 no round has
        # a tail), so that the loop holds one kind of round; ptxas may unroll it, so its rounds are
        # counted by their mma (16 a round).
        whole = "unit_round<false>(unit, g, c, columns, x, w, scales, bias_rows, acc)"
        tail = whole.replace("false", "true")
        if tail not in program.text: raise SystemExit("qmv_mma.h's tail round call changed: update print_sass")
        text = program.text.replace(tail, whole)
        count, counts = loop_histogram(dataclasses.replace(program, text=text), cuobjdump)
        codes = 2 * 32 * m.unroll * counts.get("HMMA", 16) // 16  # a lane's chunks of two rows of w a unit
        print(f"qmv_mma {mode} {bits}-bit g{group} M{rows} {m}: {count} instructions per lane loop of {codes} codes "
              f"({count / codes:.2f} a code): {counts}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print the specialisations; compile nothing")
    mode.add_argument("--nvcc", action="store_true", help="compile with nvcc and report registers and local memory")
    mode.add_argument("--ptxas", action="store_true", help="nvrtc's PTX through ptxas -v: local memory and serialized wgmma")
    mode.add_argument("--sass", action="store_true", help="qmv's and qmv_mma's main-loop SASS instruction counts (CUOBJDUMP)")
    parser.add_argument("--family", action="append", help="only this family (a stem such as nuvec_qmv); repeatable")
    parser.add_argument("--full", action="store_true", help="every distinct program of the plan's walk, not the covering set")
    parser.add_argument("--grid", action="store_true", help="with --nvcc: the qmv kernels tools/tune_qmv.py sweeps instead")
    parser.add_argument("--arch", help="nvrtc's architecture where no CUDA device opens (default: the device's, else sm_90)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compilations at a time")
    args = parser.parse_args(argv)
    if args.sass:
        print_sass(os.environ.get("CUOBJDUMP", "cuobjdump"))
        return 0
    if args.nvcc and args.grid: return compile_nvcc(tuned_qmv(), args.jobs)
    try:
        by_family = chosen(args.family, args.full)
    except ValueError as error:
        parser.error(str(error))
    if args.list:
        list_specialisations(by_family)
        return 0
    if args.ptxas: return compile_ptxas([item for items in by_family.values() for item in items], args.arch or "sm_90", args.jobs)
    if args.nvcc: return compile_nvcc([item for items in by_family.values() for item in items], args.jobs)
    return compile_nvrtc(by_family, args.arch, args.jobs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

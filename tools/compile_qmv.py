"""Render every qmv specialisation and compile it (no GPU needed): `python tools/compile_qmv.py cuda`
compiles each for sm_90 with nvcc (`-Xptxas -v`) and reports registers and spills; `... metal`
writes one translation unit for the Metal shim check (tests/test_metal_check.py does the same);
`CUOBJDUMP=... python tools/compile_qmv.py sass` counts the main loop's SASS instructions of the
one-row default plans.
Specialisations: modes x widths x groups x dtypes (x and y alike; affine scales float16, bfloat16,
float32) x 1, 3 and 8 rows, default plans at K = N = 4096 (nvfp4 also at K = 4096 + 16, which
ends in a half chunk; one row also at K = 14336, whose plan has wider columns); with --grid,
instead, every kernel tools/tune_qmv.py sweeps."""
import itertools
import os
import re
import subprocess
import sys
import tempfile

from tinygrad import dtypes

from nuvec_tg.kernels import quant as qmv
from nuvec_tg.kernels.program import prelude

DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32)
N = 4096
FORMATS = [("affine", g, b) for b in (1, 2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
    ("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)]


def specialisations(grid: bool = False):
    """(label, `qmv_program` arguments) for each specialisation: the default plans over every
    format, dtype and row count, or (grid) the kernels tools/tune_qmv.py sweeps."""
    if grid:
        from tune_qmv import FORMATS as TUNED, SHAPES, plans
        for fmt, (k, n), rows in itertools.product(TUNED, SHAPES, (1, 4)):
            mode, group, bits = TUNED[fmt]
            scales = dtypes.bfloat16 if mode == "affine" else dtypes.uint8
            for p in plans(rows, k):
                yield (f"{fmt} M{rows} K{k} N{n} {p}", dict(x_dtype=dtypes.bfloat16, scales_dtype=scales, out_dtype=dtypes.bfloat16,
                                                            mode=mode, group_size=group, bits=bits, rows=rows, k=k, n=n, qmv_plan=p))
        return
    for (mode, group, bits), x, rows in itertools.product(FORMATS, DTYPES, (1, 3, 8)):
        for scales in (DTYPES if mode == "affine" else (dtypes.uint8,)):
            # K = 14336 for one row: 2+ steps a SIMD group, where one row takes COLUMNS_PER_WARP_LONG columns.
            for k in ((4096, 4096 + 16) if mode == "nvfp4" else (4096,)) + ((14336,) if rows == 1 else ()):
                p = qmv.plan(rows, k, N)
                for batches in (0, 64):  # the plain product, and the gathered one over 64 weight batches
                    yield (f"{mode} {bits}-bit g{group} x {x.name} scales {scales.name} M{rows} K{k} {p} batches {batches}",
                           dict(x_dtype=x, scales_dtype=scales, out_dtype=x, mode=mode, group_size=group, bits=bits, rows=rows,
                                k=k, n=N, qmv_plan=p, batches=batches))


def unit(backend: str, specs) -> str:
    parts = []
    for i, (_, kwargs) in enumerate(specs):
        program = qmv.qmv_program(backend, **kwargs)
        text = program.text.replace(f"{program.name}(", f"nuvec_qmv_{i}(")  # one name per position, duplicates apart
        defined = [line.split()[1].split("(")[0] for line in text.splitlines() if line.startswith("#define ")]
        parts.append(f"namespace spec{i} {{\n{text}}}\n" + "".join(f"#undef {d}\n" for d in defined))
    return prelude(backend) + "\n".join(parts)


def compile_cuda(specs, jobs: int = os.cpu_count() or 2) -> int:
    """Compile for sm_90 in `jobs` nvcc processes; print registers and local memory (stack frame,
    spills) per specialisation; nonzero if any uses local memory."""
    chunks = [specs[i::jobs * 4] for i in range(jobs * 4)]
    tmp = tempfile.mkdtemp()
    procs = []
    for j, chunk in enumerate(chunks):
        src = f"{tmp}/qmv{j}.cu"
        open(src, "w").write(unit("cuda", chunk))
        procs.append((chunk, subprocess.Popen(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", f"{tmp}/qmv{j}.cubin", src],
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        if len(procs) >= jobs or j == len(chunks) - 1:
            bad = 0
            for chunk_, proc in procs:
                out = proc.communicate()[0]
                if proc.returncode: print(out[:4000]); return 1
                found = {int(m.group(1)): (int(m.group(4)), int(m.group(2)), int(m.group(3))) for m in re.finditer(
                    r"Compiling entry function 'nuvec_qmv_(\d+)'.*?(\d+) bytes stack frame, (\d+) bytes spill stores.*?"
                    r"Used (\d+) registers", out, re.S)}
                for i, (label, _) in enumerate(chunk_):
                    registers, stack, spill = found[i]
                    print(f"{registers:4d} registers {stack:4d} stack {spill:4d} spilled  {label}")
                    bad += stack > 0 or spill > 0
            procs = []
            if bad: print(f"{bad} specialisations use local memory"); return 1
    return 0


def loop_histogram(spec, cuobjdump: str) -> tuple[int, dict[str, int]]:
    """(instructions, count per opcode) of the main loop (the longest backward branch's body) of one
    specialisation's sm_90 SASS."""
    tmp = tempfile.mkdtemp()
    open(f"{tmp}/one.cu", "w").write(unit("cuda", [spec]))
    subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", f"{tmp}/one.cubin", f"{tmp}/one.cu"], check=True)
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


if __name__ == "__main__":
    backend = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    if backend == "sass":  # main-loop instruction counts of the one-row default plans, K = N = 4096
        cuobjdump = os.environ.get("CUOBJDUMP", "cuobjdump")
        for mode, group, bits in (("affine", 64, 4), ("affine", 64, 8), ("mxfp4", 32, 4)):
            p = qmv.plan(1, 4096, N)
            spec = (mode, dict(x_dtype=dtypes.bfloat16, scales_dtype=dtypes.bfloat16 if mode == "affine" else dtypes.uint8,
                               out_dtype=dtypes.bfloat16, mode=mode, group_size=group, bits=bits, rows=1, k=4096, n=N, qmv_plan=p))
            count, counts = loop_histogram(spec, cuobjdump)
            codes = 32 * p.columns_per_warp * p.unroll
            print(f"{mode} {bits}-bit g{group} M1 {p}: {count} instructions per lane step of {codes} codes "
                  f"({count * 32 / codes:.1f} per 32 codes of a column): {counts}")
        sys.exit(0)
    specs = list(specialisations(grid="--grid" in sys.argv))
    print(f"{len(specs)} specialisations", flush=True)
    if backend == "metal":
        open("/tmp/qmv_all.metal", "w").write(unit("metal", specs))
        print("wrote /tmp/qmv_all.metal")
    else:
        sys.exit(compile_cuda(specs))

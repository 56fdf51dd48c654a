"""Test set-up: tinygrad's C compiler, a `device` parameter over the devices present, and the
reasons for skipped tests, one line each.

Tests that take a `device` argument run once on tinygrad's CPU device (the compositions; needs
clang) and once on each GPU tinygrad finds (`METAL`, `CUDA`), those marked `gpu` so that
`pytest -m gpu` runs only them on a machine without a usable CPU compiler. A GPU asked for
(`DEV=CUDA`, `DEV=METAL`, `NUVEC_REQUIRE_GPU=1`) that does not open stops the run.
"""
import collections
import os
import pathlib

import pytest

_WRAPPER = pathlib.Path(__file__).resolve().parents[1] / ".venv" / "bin" / "tinygrad-cc"
if "CC" not in os.environ and _WRAPPER.exists():
    os.environ["CC"] = str(_WRAPPER)  # before tinygrad compiles anything

# tinygrad's own kernels without its hand-coded optimizations (upcasts, unrolls, local groups)
# unless a GPU is asked for: the suite's shapes are small, and choosing those optimizations is
# most of the CPU suite's time (2.4x on the attention and norm tests). Our kernels are written by
# hand and are not affected. Tests of bits that tinygrad's optimizations could change (a row's
# bits against its batch) run under `optimized` (tinygrad's default) as users' programs do.
if not os.environ.get("DEV") and os.environ.get("NUVEC_REQUIRE_GPU", "0") == "0":
    os.environ.setdefault("NOOPT", "1")


@pytest.fixture
def optimized():
    """Run the test with tinygrad's hand-coded optimizations on, as a user's program has them."""
    from tinygrad.helpers import Context
    with Context(NOOPT=0):
        yield


GPUS = ("METAL", "CUDA")


def gpu_devices(environment=os.environ, open_device=None) -> list[str]:
    """The GPU devices that open (`open_device(name)`, default tinygrad's `Device[name]`, raises
    where one does not). A GPU asked for, by `DEV=CUDA` or `DEV=METAL` (tinygrad's own variable)
    or by `NUVEC_REQUIRE_GPU=1` (any; the device check sets it), that does not open is an error,
    not a run of skipped GPU tests that exits 0."""
    from tinygrad import Device
    from tinygrad.helpers import Target
    open_device = open_device or Device.__getitem__
    found, failures = [], {}
    for name in GPUS:
        try:
            open_device(name)
        except Exception as error:  # noqa: BLE001 - any failure to open means the device is absent
            failures[name] = f"{type(error).__name__}: {error}"
            continue
        found.append(name)
    for name in (Target.parse(part).device for part in environment.get("DEV", "").split(";") if part):
        if name in GPUS and name not in found:
            raise RuntimeError(f"DEV={environment['DEV']} asks for {name}, which did not open: {failures[name]}")
    if not found and environment.get("NUVEC_REQUIRE_GPU", "0") != "0":
        raise RuntimeError("NUVEC_REQUIRE_GPU is set but no GPU device opened: " +
                           "; ".join(f"{name}: {failure}" for name, failure in failures.items()))
    return found


GPU_DEVICES = gpu_devices()


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        params = [pytest.param("CPU", id="CPU")]
        # float64 references need a device with float64: the CPU's.
        if metafunc.definition.get_closest_marker("float64") is None:
            params += [pytest.param(name, id=name, marks=pytest.mark.gpu) for name in GPU_DEVICES]
        metafunc.parametrize("device", params)


def pytest_terminal_summary(terminalreporter):
    """One line per reason tests were skipped, with their count: pytest's `-rs` prints one per
    test location (dozens of "no GPU" lines on a machine without one)."""
    if terminalreporter.hasopt("skipped"):
        return  # pytest's own list, by location, was asked for
    reasons = collections.Counter(report.longrepr[2].removeprefix("Skipped: ")
                                  for report in terminalreporter.stats.get("skipped", []))
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"SKIPPED [{count}] {reason}", yellow=True)

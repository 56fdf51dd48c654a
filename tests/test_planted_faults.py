"""Planted faults: each emulated test must fail on a kernel with a typical bug. Every test renders
a kernel family's program as its emulated test does, edits the rendered text in one place (the
edit must apply exactly once, so that a fault cannot silently stop being planted when the source
changes), runs it through that test's own comparison (or the launch's bounds check, for a fault
that reads or writes outside its buffers), and expects it to fail. The kernel sources have no
fault switches: the faults live here only."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from tinygrad import dtypes

import test_decode_emulated as vector
import test_decode_mma_emulated as matrix
import test_gated_delta_emulated as gated
import test_norm_rope_emulated as norm_rope
import test_take_emulated as take
import test_paged_write_emulated as paged_write
import test_prefill_emulated as prefill
import test_linear_emulated as dense
import test_qmv_emulated as quant
import test_rope_emulated as rope
import test_softmax_emulated as rows
from kernel_emulator import CHECKS_EVERY_ACCESS, COMPILER
from nuvec_tg.kernels import linear
from nuvec_tg.kernels import quant as qmv
from nuvec_tg.kernels.program import Program

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
needs_access_checks = pytest.mark.skipif(not CHECKS_EVERY_ACCESS, reason="the emulator checks every access with clang only")

DIFFER = "elements differ"                 # assert_rows_close's message
OUTSIDE = "outside the launch's buffers"   # the launch's bounds check


class NotPlanted(Exception):
    """A fault's text is not in the program exactly once (not an AssertionError: never 'caught')."""


@dataclasses.dataclass
class Fault:
    """A textual edit of a rendered program: `old` (which must occur exactly once) becomes `new`."""
    old: str
    new: str
    planted: int = 0

    def __call__(self, program: Program) -> Program:
        count = program.text.count(self.old)
        if count != 1: raise NotPlanted(f"{program.name}: {self.old!r} occurs {count} times")
        self.planted += 1
        return dataclasses.replace(program, text=program.text.replace(self.old, self.new))


def expect_failure(fault: Fault, run, message: str = DIFFER) -> None:
    """`run()` with the fault planted fails with an AssertionError matching `message`."""
    with pytest.raises(AssertionError, match=message):
        run()
    assert fault.planted, "the faulty program never ran"


# Vector decode pass (sdpa_decode.h, sdpa_keys.h).
VECTOR_FAULTS = {
    "drop_last_block": ("additive_mask_d192", Fault("const int key_end = min(k_len, key_begin + per_block);",
                                                    "const int key_end = block == BLOCKS - 1 ? key_begin : min(k_len, key_begin + per_block);")),
    "window_off_by_one": ("window_sinks", Fault("visible = visible && key > k_len - LQ + my_position - window;",
                                                "visible = visible && key >= k_len - LQ + my_position - window;")),
    # Query head h reads key head h % Hkv rather than h / (Hq / Hkv).
    "head_mapping": ("cache_slices_d256", Fault("q + ((batch * HQ + q_head) * LQ + position) * D + part * EQ;",
                                             "q + ((batch * HQ + q_head % GQA * HKV + kv_head) * LQ + position) * D + part * EQ;")),
    "wrong_scale": ("bool_mask_sinks_d96", Fault("q_reg[r][e] = to_float(q_row[e]) * SCALE_LOG2E;",
                                                 "q_reg[r][e] = to_float(q_row[e]) * SCALE_LOG2E * 1.125f;")),
}


@pytest.mark.parametrize("fault_name", list(VECTOR_FAULTS))
def test_vector_decode_faults_fail_its_comparison(fault_name):
    case, fault = VECTOR_FAULTS[fault_name]
    expect_failure(fault, lambda: vector.check_decode(case, first_edit=fault))


@needs_access_checks
def test_vector_decode_reading_unclamped_table_entries_fails_the_bounds_check():
    fault = Fault("const int page = min(max(block_tables[batch * max_blocks + (key) / PAGE], 0), pool_blocks - 1);",
                  "const int page = block_tables[batch * max_blocks + (key) / PAGE];")
    expect_failure(fault, lambda: vector.check_decode("paged_window_f32", first_edit=fault), OUTSIDE)


# Matrix-unit decode pass (sdpa_decode_mma.h).
MATRIX_FAULTS = {
    "drop_last_block": ("gqa8", Fault("const int key_end = min(k_len, key_begin + per_block);",
                                      "const int key_end = block == BLOCKS - 1 ? key_begin : min(k_len, key_begin + per_block);")),
    "window_off_by_one": ("window", Fault("visible = visible && key > k_len - LQ + row_position[r] - window;",
                                          "visible = visible && key >= k_len - LQ + row_position[r] - window;")),
    "head_mapping": ("gqa8", Fault("row_head[half_rows] = kv_head * GQA + row / LQ;", "row_head[half_rows] = row / LQ * HKV + kv_head;")),
}


@pytest.mark.parametrize("fault_name", list(MATRIX_FAULTS))
def test_matrix_decode_faults_fail_its_comparison(fault_name):
    case, fault = MATRIX_FAULTS[fault_name]
    expect_failure(fault, lambda: matrix.check_matrix_pass(case, edit=fault))


@needs_access_checks
def test_matrix_decode_reading_unclamped_table_entries_fails_the_bounds_check():
    fault = Fault("const int page = min(max(block_tables[batch * max_blocks + key / PAGE], 0), pool_blocks - 1);",
                  "const int page = block_tables[batch * max_blocks + key / PAGE];")
    expect_failure(fault, lambda: matrix.check_matrix_pass("paged_hostile", edit=fault), OUTSIDE)


# The merge of the partials (sdpa_merge.h): on random partials, and after the vector first pass.
MERGE_FAULTS = {
    "ignores_last_partial": ("rounds_of_splits", Fault("for (int b = split; b < BLOCKS; b += SPLITS) {",
                                                       "for (int b = split; b < BLOCKS - 1; b += SPLITS) {")),
    "ignores_maxima": ("rounds_of_splits", Fault("const float factor = merge_factor(part_max[row * BLOCKS + b], merged);",
                                          "const float factor = part_max[row * BLOCKS + b] == -INFINITY ? 0.0f : 1.0f;")),
    "sink_of_another_head": ("rounds_of_splits", Fault("q_head = (row / LQ) % HQ", "q_head = (row / LQ + 1) % HQ")),
}


@pytest.mark.parametrize("fault_name", list(MERGE_FAULTS))
def test_merge_faults_fail_its_comparison(fault_name):
    case, fault = MERGE_FAULTS[fault_name]
    expect_failure(fault, lambda: vector.check_merge(case, edit=fault))


def test_a_merge_ignoring_a_partial_fails_the_two_pass_decode():
    fault = Fault("for (int b = split; b < BLOCKS; b += SPLITS) {", "for (int b = split; b < BLOCKS - 1; b += SPLITS) {")
    expect_failure(fault, lambda: vector.check_decode("additive_mask_d192", merge_edit=fault))


# The gated delta rule (gated_delta.h).
GATED_FAULTS = {
    "gate_not_applied": ("grouped_bf16_inputs", Fault("s[r][e] *= decay;", "s[r][e] *= 1.0f;")),
    "key_head_mapping": ("grouped_bf16_inputs", Fault("const int key_head = head / (HV / HK);", "const int key_head = head % HK;")),
    "output_from_the_stale_state": ("one_step_f32", Fault("s[r][e] += key[e] * correction;\n        out += s[r][e] * query[e];",
                                                          "out += s[r][e] * query[e];\n        s[r][e] += key[e] * correction;")),
}


@pytest.mark.parametrize("fault_name", list(GATED_FAULTS))
def test_gated_delta_faults_fail_its_comparison(fault_name):
    case, fault = GATED_FAULTS[fault_name]
    expect_failure(fault, lambda: gated.check_gated_delta(case, edit=fault))


@needs_access_checks
def test_gated_delta_with_out_of_range_slots_as_live_fails_the_bounds_check():
    """A slot past the pool taken as live reads and writes outside the pool."""
    fault = Fault("const bool live = slot >= 0 && slot < ints[1];", "const bool live = slot >= 0;")
    expect_failure(fault, lambda: gated.check_gated_delta("slots_hostile_bf16", edit=fault), OUTSIDE)


# The chunked gated delta prefill (gated_delta_chunks.h, then gated_delta_pass.h).
CHUNKS_FAULTS = {  # in the first pass
    "substitution_skips_a_term": ("chunked_bf16", Fault("for (int m = 0; m < i; m++) sum -=", "for (int m = 1; m < i; m++) sum -=")),
    "block_below_the_diagonal_negated": ("chunked_f16_grouped", Fault("float x = -block_sum[t];", "float x = block_sum[t];")),
    "decay_scan_off_by_one": ("chunked_log_decay", Fault("if (lane >= offset) x += before;", "if (lane > offset) x += before;")),
    "within_keeps_the_diagonal_out": ("chunked_bf16", Fault("const float d0 = j <= i ?", "const float d0 = j < i ?")),
}
PASS_FAULTS = {  # in the state pass
    "half_the_within_product_lost": ("chunked_bf16", Fault("tile_mma(out[j + 1], fresh_a, b1);", "(void)b1;")),
    "state_not_decayed": ("chunked_f16_grouped", Fault("s[n].v[e] *= keep;", "s[n].v[e] *= 1.0f;")),
    "within_of_another_chunk": ("chunked_four_groups", Fault("within_tiles + (chunk % 2) * CHUNK * LDW",
                                                             "within_tiles + ((chunk + 1) % 2) * CHUNK * LDW")),
    "corrections_faded_the_wrong_way": ("chunked_slots", Fault("const float fade0 = exp2(c_last - my_c[j][0])",
                                                          "const float fade0 = exp2(my_c[j][0] - c_last)")),
}


@pytest.mark.parametrize("fault_name", list(CHUNKS_FAULTS))
def test_chunked_first_pass_faults_fail_its_comparison(fault_name):
    case, fault = CHUNKS_FAULTS[fault_name]
    expect_failure(fault, lambda: gated.check_chunked(case, first_edit=fault))


@pytest.mark.parametrize("fault_name", list(PASS_FAULTS))
def test_chunked_state_pass_faults_fail_its_comparison(fault_name):
    case, fault = PASS_FAULTS[fault_name]
    expect_failure(fault, lambda: gated.check_chunked(case, second_edit=fault))


@needs_access_checks
def test_chunked_outputs_past_the_last_step_fail_the_bounds_check():
    """y written for a partial chunk's steps past the last lands outside y."""
    fault = Fault("const bool whole = first_step + CHUNK <= steps;", "const bool whole = true;")
    expect_failure(fault, lambda: gated.check_chunked("chunked_bf16", second_edit=fault), OUTSIDE)


@needs_access_checks
def test_chunked_lines_past_the_last_step_fail_the_bounds_check():
    """Q's and K's lines copied for a partial chunk's steps past the last are read outside q and k."""
    fault = Fault("const bool present = !(CHECKED) || (FIRST_STEP) + r < steps;", "const bool present = true;")
    expect_failure(fault, lambda: gated.check_chunked("chunked_bf16", second_edit=fault), OUTSIDE)


@needs_access_checks
def test_chunked_dead_slots_as_live_fail_the_bounds_check():
    fault = Fault("const bool live = slot >= 0 && slot < ints[1];", "const bool live = true;")
    expect_failure(fault, lambda: gated.check_chunked("chunked_slots", second_edit=fault), OUTSIDE)


# The quantized products (qmv.h, qvm.h, qmm.h), each through its emulated test's comparison.
@functools.cache
def qmv_case():
    return quant.qmv_inputs("affine", 32, 4, dtypes.float32)


QMV_FAULTS = {
    "skips_a_groups_bias": Fault("sums[m * COLUMNS + c] = fma(bias, x_sums[m], fma(scale, dots[m * COLUMNS + c], sums[m * COLUMNS + c]));",
                                 "sums[m * COLUMNS + c] = fma(scale, dots[m * COLUMNS + c], sums[m * COLUMNS + c]);"),
    "drops_a_k_split_partial": Fault("for (int s = 1; s < K_SPLIT; s++)", "for (int s = 1; s < K_SPLIT - 1; s++)"),
}


@pytest.mark.parametrize("fault", [Fault("load_x8(at + K_TOTAL, ups);", "load_x8(at, ups);"),     # the gate read as up
                                   Fault("xs[j] = swiglu_value<TX>(xs[j], ups[j]);", "xs[j] = swiglu_value<TX>(xs[j], 1.0f);")],  # up dropped
                         ids=["gate_read_as_up", "up_dropped"])
def test_swiglu_qmv_faults_fail_its_comparison(fault):
    expect_failure(fault, lambda: quant.check_swiglu("affine", 64, 4, dtypes.bfloat16, fault))


@pytest.mark.parametrize("fault_name", list(QMV_FAULTS))
def test_qmv_faults_fail_its_comparison(fault_name):
    fault = QMV_FAULTS[fault_name]
    qw, x, want = qmv_case()
    plan = qmv.QmvPlan(4, 1, 2, 1)  # K split in 2, as the emulated test's first plan
    expect_failure(fault, lambda: quant.check_rows("qmv", quant.emulated_qmv(x[:3], qw, dtypes.float32, plan, fault), want[:3],
                                                   dtypes.float32))


@functools.cache
def qvm_case():
    return quant.qvm_inputs("affine", 64, 4, dtypes.bfloat16)


QVM_FAULTS = {
    "skips_a_groups_bias": Fault("weights[j] = fma(scale, q[j], bias);", "weights[j] = scale * q[j];"),
    "keeps_one_simd_groups_sums": Fault("totals[at] = s == 0 ? sums[m * 8 + j] : totals[at] + sums[m * 8 + j];",
                                        "totals[at] = sums[m * 8 + j];"),
}


@pytest.mark.parametrize("fault_name", list(QVM_FAULTS))
def test_qvm_faults_fail_its_comparison(fault_name):
    fault = QVM_FAULTS[fault_name]
    qw, x, want = qvm_case()
    expect_failure(fault, lambda: quant.check_rows("qvm", quant.emulated_qvm(x[:2], qw, dtypes.bfloat16, fault), want[:2],
                                                   dtypes.bfloat16))


# The few rows' K split added in the cluster (qmm_wgmma_rs.h's SPLIT_SUM), through its emulated test's comparison.
FEW_ROWS_CLUSTER_FAULTS = {
    "reads_the_parts_before_the_cluster_wrote_them": Fault("cluster_barrier();      // every part's sums in place", "//"),
    "adds_the_parts_out_of_order": Fault("cluster_load4(at, part)", "cluster_load4(at, K_SPLIT - part)"),
    "drops_the_last_piece_of_each_share": Fault("end = (rank + 1) * pieces / K_SPLIT", "end = (rank + 1) * pieces / K_SPLIT - 1"),
}


@pytest.mark.parametrize("fault_name", sorted(FEW_ROWS_CLUSTER_FAULTS))
def test_few_rows_cluster_sum_faults_fail_its_comparison(fault_name):
    fault = FEW_ROWS_CLUSTER_FAULTS[fault_name]
    expect_failure(fault, lambda: few_rows_cluster_sum(fault), "not equal|Mismatch")


def test_few_rows_cluster_sum_leaving_while_others_read_fails_the_bounds_check():
    fault = Fault("cluster_barrier_relaxed();  // no threadgroup leaves", "//")
    expect_failure(fault, lambda: few_rows_cluster_sum(fault), OUTSIDE)


def few_rows_cluster_sum(edit: Fault) -> None:
    """The emulated few rows' split of 4 added in the cluster against the parts added in order."""
    rng = np.random.default_rng(0x9C5)
    qw = quant.quantized(quant.random(rng, (100, 448), dtypes.bfloat16, "CPU")[0], "affine", 64, 4)
    x = quant.raw(quant.random(rng, (13, 448), dtypes.bfloat16, "CPU")[0].realize())
    parts = quant.emulated_qmm_wgmma(x, qw, dtypes.bfloat16, qmv.RegisterTiles(16, 1, 4, 4))
    got = quant.emulated_qmm_wgmma(x, qw, dtypes.bfloat16, qmv.RegisterTiles(16, 1, 4, 4, cluster_sum=True), edit=edit,
                                   out_dtype=dtypes.float32)
    np.testing.assert_array_equal(got, functools.reduce(lambda a, b: a + b, list(parts)))


@functools.cache
def qmm_case():
    return quant.qmm_inputs("affine", 64, 4, dtypes.bfloat16)


QMM_FAULTS = {
    "skips_a_groups_bias": Fault("scale_codes(w_values, 16, group_scale(scale_raw), to_float(bias_raw));",
                                 "scale_codes(w_values, 16, group_scale(scale_raw), 0.0f);"),
    "drops_the_last_k_step": Fault("const int steps = (k_size + BK - 1) / BK;", "const int steps = (k_size + BK - 1) / BK - 1;"),
}


@pytest.mark.parametrize("fault_name", list(QMM_FAULTS))
def test_qmm_faults_fail_its_comparison(fault_name):
    fault = QMM_FAULTS[fault_name]
    qw, x, want = qmm_case()
    expect_failure(fault, lambda: quant.check_rows("qmm", quant.emulated_qmm(x, qw, dtypes.bfloat16, edit=fault), want, dtypes.bfloat16))


# The dense products (gemv.h, gemm.h), through their emulated tests' comparisons.
@functools.cache
def gemv_case():
    return dense.Case(0x11A, 3, 2 * 256 + 40, 13, dtypes.float32, bias_dtype=dtypes.float32)


GEMV_FAULTS = {
    "drops_a_k_split_partial": Fault("for (int s = 1; s < K_SPLIT; s++)", "for (int s = 1; s < K_SPLIT - 1; s++)"),
    "drops_the_last_k_step": Fault("if (piece >= PIECES) continue;\n      float w_values",
                                   "if (piece >= (STEPS - 1) * 32) continue;\n      float w_values"),
    "skips_the_bias": Fault("total += to_float(bias[n]);", ""),
}


@pytest.mark.parametrize("fault_name", list(GEMV_FAULTS))
def test_gemv_faults_fail_its_comparison(fault_name):
    fault, case = GEMV_FAULTS[fault_name], gemv_case()
    plan = linear.gemv_plan(3, *case.x.shape[1:], case.w.shape[0])
    assert plan.k_split == 2
    expect_failure(fault, lambda: dense.check_rows("gemv", dense.emulated_gemv(case, slice(0, 3), plan, fault), case.want,
                                                   dtypes.float32))


@functools.cache
def gemm_case():
    return dense.Case(0x11E, 70, 100, 67, dtypes.bfloat16, bias_dtype=dtypes.bfloat16)


GEMM_FAULTS = {
    "drops_the_last_k_step": (DIFFER, Fault("const int steps = (k_size + BK - 1) / BK;",
                                            "const int steps = (k_size + BK - 1) / BK - 1;")),
    # the tail's copies past K: the next row's first elements, and past the last row the buffer's end
    "copies_past_k": (OUTSIDE, Fault("const bool present = row_in && k + c * COPY_ELEMENTS < k_size;",
                                     "const bool present = row_in && k + c * COPY_ELEMENTS <= k_size;")),
    # fragments read from the unswizzled places of the rows the copies swizzled
    "reads_x_unswizzled": (DIFFER, Fault("a_lane[h] = swizzled(lane % 16, 16 * h + (lane / 16) * 8);",
                                         "a_lane[h] = (lane % 16) * BK + 16 * h + (lane / 16) * 8;")),
}


@pytest.mark.parametrize("fault_name", list(GEMM_FAULTS))
def test_gemm_faults_fail_its_comparison(fault_name):
    message, fault = GEMM_FAULTS[fault_name]
    case = gemm_case()
    expect_failure(fault, lambda: dense.check_rows("gemm", dense.emulated_gemm(case, slice(0, 70), linear.GEMM_SMALL, edit=fault),
                                                   case.want, dtypes.bfloat16), message)


WGMMA_FAULTS = {
    # the copies store the pieces where they come from, the tensor cores read them swizzled
    "copies_unswizzled": (DIFFER, Fault("const int swizzled_piece = 16 * (piece ^ (first_row % 8));",
                                        "const int swizzled_piece = 16 * piece;")),
    # the last step's pieces past K read: the next row's first elements, and past the last the buffer's end
    "copies_past_k": (f"{DIFFER}|{OUTSIDE}", Fault("const bool k_in = k_first + 8 * piece < k_size;",
                                                    "const bool k_in = k_first < k_size;")),
    "skips_the_last_step": (DIFFER, Fault("for (int step = 0; step < steps; step++) {",
                                          "for (int step = 0; step < steps - 1; step++) {")),
    # the accumulator's second row of a SIMD group's 16 taken as 4 rows on, not 8
    "stores_rows_4_apart": (DIFFER, Fault("const int row = row_first + 8 * half_tile;", "const int row = row_first + 4 * half_tile;")),
}


@pytest.mark.parametrize("fault_name", list(WGMMA_FAULTS))
def test_gemm_wgmma_faults_fail_its_comparison(fault_name):
    message, fault = WGMMA_FAULTS[fault_name]
    case = dense.Case(0x123, 70, 200, 67, dtypes.bfloat16, bias_dtype=dtypes.bfloat16)
    expect_failure(fault, lambda: dense.check_rows("gemm_wgmma", dense.emulated_gemm_wgmma(case, slice(0, 70), linear.WGMMA_SMALL,
                                                                                           edit=fault), case.want, dtypes.bfloat16), message)


GATHERED_FAULTS = {
    "every_run_takes_the_first_batch": (DIFFER, Fault("w + (size_t)(batch_real ? batch : 0) * n_size * k_size;", "w;")),
    # a run's last row stored by the next run's product too late: the run takes one row of the next
    "runs_one_row_long": (DIFFER, Fault("run_end = pick_run_end(picks, run_start, tile_end);",
                                        "run_end = min(pick_run_end(picks, run_start, tile_end) + 1, tile_end);")),
    "negative_picks_read": (OUTSIDE, Fault("const bool batch_real = batch >= 0 && batch < ints[3];",
                                           "const bool batch_real = batch < ints[3];")),
}


@pytest.mark.parametrize("fault_name", list(GATHERED_FAULTS))
@pytest.mark.parametrize("kernel, tiles, metal_tiles", [("gemm", linear.GEMM_SMALL, False), ("gemm", linear.GEMM_METAL, True),
                                                        ("gemm_wgmma", linear.WGMMA_SMALL, False)], ids=str)
def test_gathered_product_faults_fail_its_comparison(fault_name, kernel, tiles, metal_tiles):
    message, fault = GATHERED_FAULTS[fault_name]
    case = dense.GatherCase(0x124, dense.GATHER_PICKS["unsorted_and_outside"], 72, 40, 4)
    expect_failure(fault, lambda: dense.check_rows("gathered", case.run(kernel, tiles, metal_tiles, fault), case.want,
                                                   dtypes.bfloat16), message)


def test_swiglu_gemv_reading_no_up_half_fails_its_comparison():
    fault = Fault("xs[j] = swiglu_value<TX>(xs[j], ups[j]);", "xs[j] = swiglu_value<TX>(xs[j], 1.0f);")
    expect_failure(fault, lambda: dense.check_swiglu_gemv(dtypes.bfloat16, dtypes.bfloat16, 264, fault))


TAKE_FAULTS = {
    "negative_indices_read": (OUTSIDE, Fault("row >= 0 && row < rows ?", "row < rows ?"), "indices_just_past_either_end"),
    "every_chunk_the_rows_first": (r"Arrays are not equal", Fault("x[(long)row * chunks + c]", "x[(long)row * chunks]"),
                                   "bf16_embedding_rows_chunks_of_16"),
}


@pytest.mark.parametrize("fault_name", [pytest.param(name, marks=needs_access_checks) if TAKE_FAULTS[name][0] == OUTSIDE else name
                                        for name in TAKE_FAULTS])
def test_take_faults_fail_its_comparison(fault_name):
    message, fault, case = TAKE_FAULTS[fault_name]
    expect_failure(fault, lambda: take.check_case(case, fault), message)


def test_gemm_in_metals_layout_reading_past_k_fails_its_comparison():
    fault = Fault("x_in[i] && k + j < k_size ?", "x_in[i] && k + j <= k_size ?")
    case = gemm_case()
    expect_failure(fault, lambda: dense.check_rows("gemm", dense.emulated_gemm(case, slice(0, 70), linear.GEMM_METAL, True, fault),
                                                   case.want, dtypes.bfloat16), f"{DIFFER}|{OUTSIDE}")


# The softmax family (softmax.h), through its emulated test's comparisons.
SOFTMAX_FAULTS = {
    "drops_the_last_simd_groups_sum": (lambda edit: rows.check_case("softmax_1000_bf16", edit),
                                       Fault("for (int w = 0; w < THREADS / 32; w++) total += sums[w];",
                                             "for (int w = 0; w < THREADS / 32 - 1; w++) total += sums[w];")),
    "keeps_a_sum_on_its_old_maximum": (lambda edit: rows.check_case("logsumexp_20000_looped_f32", edit),
                                       Fault("sum = fma(sum, shifted_exp(top, grown), shifted_exp(v[0], grown));",
                                             "sum = sum + shifted_exp(v[0], grown);")),
    "thread_sums_not_moved_onto_the_rows_maximum": (lambda edit: rows.check_case("softmax_16385_looped_f16", edit),
                                                    Fault("sum *= shifted_exp(top, row_max);", "")),
    # The emulator's threads run until they wait: without the barrier a SIMD group reads the others' slots
    # before they are written (or, in the other sweep order, after the next row's are).
    "a_missing_barrier_before_the_simd_groups_sums_are_read": (
        lambda edit: rows.check_case("softmax_1000_bf16", edit),
        Fault("if (lane == 0) sums[warp] = sum;\n  threadgroup_barrier();", "if (lane == 0) sums[warp] = sum;")),
    "negative_targets_not_counted_from_the_end": (lambda edit: rows.check_case("cross_entropy_seven_f32", edit),
                                                  Fault("if (target < 0) target += length;", "")),
    "a_minus_inf_element_beside_a_minus_inf_maximum_is_nan": (
        lambda edit: rows.check_infinite_rows(9000, ("logsumexp",), edit),
        Fault("return v == -INFINITY ? 0.0f : exp2((v - top) * LOG2E);", "return exp2((v - top) * LOG2E);")),
}


@pytest.mark.parametrize("fault_name", list(SOFTMAX_FAULTS))
def test_softmax_faults_fail_its_comparison(fault_name):
    check, fault = SOFTMAX_FAULTS[fault_name]
    expect_failure(fault, lambda: check(fault), f"{DIFFER}|non-finite values differ")


@needs_access_checks
def test_cross_entropy_reading_an_unchecked_target_fails_the_bounds_check():
    """Targets one before the first row's classes and one past the last row's, read unchecked."""
    fault = Fault("(target >= 0 && target < length ? to_float(x[base + target]) : 0.0f)", "to_float(x[base + target])")
    x, targets = rows.inputs(3, 7, dtypes.float32), np.array([-8, 0, 7], np.int32)
    expect_failure(fault, lambda: rows.emulate("cross_entropy", x, dtypes.float32, targets, fault), OUTSIDE)


# rope (rope.h), through its emulated test's comparisons.
ROPE_FAULTS = {
    "halves_paired_as_adjacent_pieces": ("halves_128_f32", Fault("first + UNIT_GAP(VEC, pairs)", "first + VEC")),
    "sine_of_the_wrong_sign": ("traditional_128_bf16", Fault("fma((v)[p_], c_, -((v)[q_] * s_))", "fma((v)[p_], c_, (v)[q_] * s_)")),
    "every_batch_item_at_the_first_offset": ("halves_dims_64_of_128_per_batch_f16",
                                             Fault("offsets[per_batch ? b : 0]", "offsets[0]")),
    "scale_ignored": ("halves_4_of_6_per_batch_bf16", Fault("(float)position * SCALE", "(float)position")),
    "every_piece_at_the_first_frequencies": ("traditional_dims_40_of_80_freqs_f32",
                                             Fault("inv_freq + u * VEC", "inv_freq")),
    "features_past_dims_not_copied": ("halves_dims_64_of_128_per_batch_f16",
                                      Fault("    STORE_PIECE(CHUNK_X, X_CHUNKS, TX, v, y + at)\n", "")),
}


@pytest.mark.parametrize("fault_name", list(ROPE_FAULTS))
def test_rope_faults_fail_its_comparison(fault_name):
    case, fault = ROPE_FAULTS[fault_name]
    expect_failure(fault, lambda: rope.check_case(case, fault), f"{DIFFER}|not equal")


@needs_access_checks
def test_rope_reading_a_batch_items_offset_of_a_single_offset_fails_the_bounds_check():
    """One offset for two batch items, read as if there were one per item."""
    fault = Fault("offsets[per_batch ? b : 0]", "offsets[b]")
    expect_failure(fault, lambda: rope.check_case("halves_128_f32", fault), OUTSIDE)


# norm_rope (norm_rope.h), through its emulated test's comparisons.
NORM_ROPE_FAULTS = {
    "every_row_of_a_simd_group_summed_as_its_first": ("fresh_halves_128_bf16",
                                                      Fault("simd_shuffle(sum, r * LANES + lane % LANES)", "simd_shuffle(sum, lane % LANES)")),
    "a_row_of_two_simd_groups_summed_by_its_own": ("fresh_1024_a_threadgroup_a_row_f16",
                                                   Fault("GROUP_SUM(sum, squares)", "squares = simd_sum(sum);")),
    "the_weight_not_applied": ("kv_fresh_256_freqs_bf16", Fault(") * weight_[e]));", ")));")),
    "every_row_turns_its_threadgroups_first_row": ("fresh_traditional_64_per_batch_f32",
                                                   Fault("const int at_row = mine * HELD;", "const int at_row = 0;")),
    "the_cache_one_position_late": ("cache_int_offset_bf16", Fault("(long)offsets[0] + t;", "(long)offsets[0] + t + 1;")),
    "every_head_into_the_pools_first": ("pool_shuffled_bf16", Fault("(row / steps) % heads", "0")),
    "features_past_dims_not_written": ("cache_rows_past_the_cache_f32",
                                       Fault("      STORE_ROTATED(out, at)\n", "")),
    "values_not_normalised": ("cache_kv_f32_into_bf16", Fault("to_float(TX(held[k][e] * value_scale))", "held[k][e]")),
    "copied_values_read_at_the_keys_columns": ("pool_copied_values_of_a_projection_bf16",
                                               Fault("(long)ints[15] + (long)b * ints[16]", "(long)ints[10] + (long)b * ints[16]")),
    "copied_values_taken_from_the_keys_rows": ("cache_copied_values_bf16",
                                               Fault("LOAD_PIECE(CHUNK_VI, VI_CHUNKS, TVI, v_rows + v_base + (long)p * VEC, v)",
                                                     "for (int e = 0; e < VEC; e++) v[e] = held[k][e];")),
    "queries_normalised_with_the_keys_weight": ("cache_rows_not_filling_a_threadgroup_128_bf16_f32_weight",
                                                Fault("query ? q_weight : weight", "weight")),
    "queries_read_at_the_keys_columns": ("cache_a_models_qkv_projection_bf16", Fault("const int layout = query ? 21 : 9;",
                                                                                     "const int layout = 9;")),
    "the_last_threadgroup_of_queries_taken_by_the_keys": ("cache_rows_not_filling_a_threadgroup_128_bf16_f32_weight",
                                                          Fault("(ints[19] + ROWS - 1) / ROWS", "ints[19] / ROWS")),
}


@pytest.mark.parametrize("fault_name", list(NORM_ROPE_FAULTS))
def test_norm_rope_faults_fail_its_comparison(fault_name):
    case, fault = NORM_ROPE_FAULTS[fault_name]
    check = norm_rope.check_query_case if case in norm_rope.QUERY_CASES else norm_rope.check_case
    expect_failure(fault, lambda: check(case, fault), f"{DIFFER}|non-finite values differ")


NORM_ROPE_OUTSIDE = {
    "rows_past_the_last_read": ("fresh_halves_128_bf16", Fault("  if (row < rows && !query) {\n", "  if (!query) {\n")),
    "cache_positions_unchecked": ("cache_rows_past_the_cache_f32",
                                  Fault("if (position >= 0 && position < places) dest", "dest")),
    "slots_unchecked": ("pool_slots_just_past_either_end_f32", Fault("if (slot >= 0 && slot < places)\n", "\n")),
}


@needs_access_checks
@pytest.mark.parametrize("fault_name", list(NORM_ROPE_OUTSIDE))
def test_norm_rope_reading_or_writing_past_its_buffers_fails_the_bounds_check(fault_name):
    case, fault = NORM_ROPE_OUTSIDE[fault_name]
    expect_failure(fault, lambda: norm_rope.check_case(case, fault), OUTSIDE)


# Tiled prefill (sdpa_prefill.h).
PREFILL_FAULTS = {
    "drop_last_key_tile": ("causal_continuing", Fault("tile < tile_end; tile++", "tile < tile_end - 1; tile++")),
    "sum_not_moved_onto_a_new_maximum": ("causal_continuing", Fault("row_sum[rt][h] *= factor;", "")),
    "row_sum_of_two_lanes_only": ("causal_gqa4", Fault("sum += simd_shuffle_xor(sum, ROW_PEER_B);", "")),
    "causal_off_by_one": ("causal_gqa4", Fault("visible = visible && (key) <= (pos) + shift;",
                                               "visible = visible && (key) <= (pos) + shift + 1;")),
    "window_off_by_one": ("window_below", Fault("visible = visible && (key) > (pos) + shift - window;",
                                                "visible = visible && (key) >= (pos) + shift - window;")),
    # Row R's query head taken as R / positions rather than R % GQA (the packing read the other way).
    "head_packing": ("sinks_causal", Fault("row_head[rt][h] = kv_head * GQA + row % GQA;",
                                           "row_head[rt][h] = kv_head * GQA + row / q_len % GQA;")),
}


@pytest.mark.parametrize("fault_name", list(PREFILL_FAULTS))
def test_prefill_faults_fail_its_comparison(fault_name):
    case, fault = PREFILL_FAULTS[fault_name]
    expect_failure(fault, lambda: prefill.check(case, edit=fault), f"{DIFFER}|an output not written")


# The warpgroup kernel (sdpa_prefill_wgmma.h), two warpgroups over 64-key tiles.
PREFILL_WGMMA_SHAPE = prefill.Tiled(8, 1, 64, False, wgmma_stages=2)
PREFILL_WGMMA_FAULTS = {
    # key steps' weights packed as rows g, g + 8 at k 2c + 8 where the registers want k 2c first
    "weights_packed_the_other_way": ("causal_gqa4", Fault("weights[j / 2][h + 2 * (j % 2)]", "weights[j / 2][2 * h + (j % 2)]")),
    "v_blocks_on_top_of_each_other": ("d128", Fault("(const T*)v_tile, K_BLOCK_BYTES, step)", "(const T*)v_tile, 0, step)")),
    "next_tile_into_the_stage_being_read": ("causal_continuing", Fault("((index + STAGES - 1) % STAGES)", "(index % STAGES)")),
    "copies_not_swizzled": ("no_mask_gqa3", Fault("16 * (piece ^ (first_line % 8))", "16 * piece")),
    "every_warpgroup_on_the_first_rows_of_q": ("causal_gqa4", Fault("+ warpgroup * 64 * LINE_BYTES)", ")")),
}


@pytest.mark.parametrize("fault_name", list(PREFILL_WGMMA_FAULTS))
def test_prefill_wgmma_faults_fail_its_comparison(fault_name):
    case, fault = PREFILL_WGMMA_FAULTS[fault_name]
    expect_failure(fault, lambda: prefill.check(case, PREFILL_WGMMA_SHAPE, edit=fault), f"{DIFFER}|an output not written")


@needs_access_checks
def test_prefill_reading_unclamped_table_entries_fails_the_bounds_check():
    fault = Fault("const int page = min(max(block_tables[batch * max_blocks + key / PAGE], 0), pool_blocks - 1);",
                  "const int page = block_tables[batch * max_blocks + key / PAGE];")
    expect_failure(fault, lambda: prefill.check("paged_hostile", edit=fault), OUTSIDE)


# The paged pool's write (paged_write.h), through its emulated test's bit-for-bit comparison.
PAGED_WRITE_FAULTS = {
    "every_head_into_the_first": ("bf16_pieces_of_8_shuffled", Fault("* heads + row % heads)", "* heads + 0)")),
    "the_block_taken_as_the_slot": ("f32_pieces_of_4", Fault("(long)(slot / block_size) * heads", "(long)(slot % 2) * heads")),
    "the_source_read_as_the_pools_dtype": ("f32_into_bf16_rounded", Fault("LOAD_PIECE(CHUNK_S, S_CHUNKS, TS,", "LOAD_PIECE(CHUNK_P, P_CHUNKS, TP,")),
    "the_last_piece_of_a_row_dropped": ("f16_pieces_of_2_length_6", Fault("if (slot < 0 || slot >= places) return;",
                                                                          "if (slot < 0 || slot >= places || p == pieces - 1) return;")),
}


@pytest.mark.parametrize("fault_name", list(PAGED_WRITE_FAULTS))
def test_paged_write_faults_fail_its_comparison(fault_name):
    case, fault = PAGED_WRITE_FAULTS[fault_name]
    expect_failure(fault, lambda: paged_write.check_case(case, fault), "Arrays are not equal")


@needs_access_checks
def test_paged_write_with_slots_unchecked_fails_the_bounds_check():
    fault = Fault("if (slot < 0 || slot >= places) return;", "")
    expect_failure(fault, lambda: paged_write.check_case("slots_just_past_either_end_f32", fault), OUTSIDE)

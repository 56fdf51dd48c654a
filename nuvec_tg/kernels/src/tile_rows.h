// The rows of x a threadgroup of the tiled products takes (gemm.h, gemm_wgmma.h, qmm.h, qmm_wgmma.h,
// qmm_wgmma_rs.h, qmm_wgmma_ws.h), and, gathered, their runs of one weight batch. A family's source
// placed after the program's defines: GATHER chooses each macro, so it must be defined first (in
// the prelude, before the defines, `#if GATHER` would read it as 0).

// Declares a tiled product's rows of x for this threadgroup, FIRST .. END: row tile INDEX (the
// grid's axis of row tiles) of BM rows, or, gathered (GATHER), the tile table's (`tile_starts`:
// kernels/quant.py's gather_tile_starts, at most BM rows, one weight batch's where the picks are
// sorted). gemm.h, gemm_wgmma.h, qmm.h, qmm_wgmma.h, qmm_wgmma_rs.h, qmm_wgmma_ws.h.
#if GATHER
#define TILE_ROWS(FIRST, END, INDEX, M_SIZE) const int FIRST = tile_starts[INDEX], END = tile_starts[(INDEX) + 1];
#else
#define TILE_ROWS(FIRST, END, INDEX, M_SIZE) const int FIRST = (int)(INDEX) * BM, END = min(FIRST + BM, M_SIZE);
#endif

// The end of the run of rows from `start` (before `end`) whose picks are start's: the gathered
// products' runs of one weight batch (GATHER in the kernels above).
INLINE int pick_run_end(const DEVICE int* picks, int start, int end) {
  int stop = start + 1;
  while (stop < end && picks[stop] == picks[start]) stop++;
  return stop;
}
// The end of the run from RUN_START: gathered, its picks' run; else the whole tile.
#if GATHER
#define RUN_END(RUN_START, TILE_END) pick_run_end(picks, RUN_START, TILE_END)
#else
#define RUN_END(RUN_START, TILE_END) (TILE_END)
#endif

// The quantized tiled products' run of rows from RUN_START (before TILE_END; qmm.h, qmm_wgmma.h,
// qmm_wgmma_rs.h, qmm_wgmma_ws.h): `run_end`, whether its weight batch is one of the ints[3]
// batches (`batch_real`; GATHER: a pick outside them reads no weights) and its first weight row
// (`first_w_row`, N_SIZE rows a batch). Without GATHER the run is the whole tile of batch 0.
#if GATHER
#define QUANT_RUN(RUN_START, TILE_END, N_SIZE)                                               \
  const int batch = picks[RUN_START], run_end = RUN_END(RUN_START, TILE_END);                \
  const bool batch_real = 0 <= batch && batch < ints[3];                                     \
  const size_t first_w_row = (size_t)(batch_real ? batch : 0) * (N_SIZE);
#else
#define QUANT_RUN(RUN_START, TILE_END, N_SIZE)                                               \
  const int run_end = RUN_END(RUN_START, TILE_END);                                          \
  const bool batch_real = true;                                                              \
  const size_t first_w_row = 0;
#endif

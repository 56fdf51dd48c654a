// The quantized matrix-matrix product for many rows (prefill), y [M, N] = x [M, K] · wᵀ over packed
// weights of 2, 4 or 8 bits (`quant_codes.h`), on Hopper's warpgroup matrix products (wgmma, CUDA
// sm_90a only) with the weights dequantized straight into the tensor cores' registers. The
// product runs as its transpose, yᵀ = w · xᵀ: w is wgmma's A, taken from registers (64 weight rows
// a warpgroup, each thread's share in mma's A fragment), x its B, read by the tensor cores from
// threadgroup memory. Against qmm_wgmma.h (w dequantized into a threadgroup tile that both
// warpgroups read): no dequantized tile, so no stores of it, no second barrier a step; each
// warpgroup dequantizes only its own rows, a thread 32 codes a step whatever the tile's rows of x.
// Other widths (3, 5, 6 bits: codes across words) run qmm_wgmma.h.
//
// A threadgroup of WARPGROUPS warpgroups computes a BM x BN tile of y (BM rows of x: wgmma's N,
// 64, 128 or 256; BN = 64 * WARPGROUPS weight rows, warpgroup g the rows 64 g .. 64 g + 63) in
// steps of BK = 64 along K (two chunks of codes a weight row). Each step's x tile (BM x 64, the
// prelude's swizzled 128-byte rows) and the weight rows' packed words (BN x 8 BITS bytes) are copied
// (cp.async) into one of STAGES stage buffers, STAGES - 2 steps ahead. At step s each thread
// dequantizes its A fragment (rows lane / 4 and + 8 of its SIMD group's 16; codes 2 c, 2 c + 1,
// 2 c + 8, 2 c + 9 of each 16 k, c = lane % 4: a pair of consecutive codes at a shift of a word
// that only the lane decides) from the stage's words into registers while the tensor cores run
// step s - 1; then its warpgroup issues step s's four wgmma of 16 k as one group and waits for step
// s - 1's. The running products read their A registers, so the fragments alternate between two
// buffers, each held until the wait that retires its step (`REGISTER_STEP`). The scales (and
// biases) are read from memory a step ahead. The buffers refilled at step s are stage s - 2's,
// which every warpgroup has waited for before step s's barrier.
//
// Bits. Every element of y sums its K products in steps of 16 along K in increasing order into one
// float32 accumulator, the weights rounded to TX first (`scale_codes`, or PAIRS' `code_pair`,
// as qmm_wgmma.h and dequantize.h round them), whatever BM, BN, STAGES, the grid or M.
//
// K_SPLIT > 1 (few rows, where the weight tiles alone would leave most multiprocessors idle):
// threadgroup z of the grid's K_SPLIT takes the steps z * S / K_SPLIT .. (z + 1) * S / K_SPLIT - 1
// of the S = K / BK, summed as above from zero, into float32 partial sums. Without SPLIT_SUM it
// writes them (TY float) to y's part z, `[K_SPLIT, M, N]`, and the caller adds the parts in order
// 0, 1, .... With SPLIT_SUM the tile's K_SPLIT threadgroups are one cluster (the launch's
// `__cluster_dims__(1, 1, K_SPLIT)`; threadgroup z its rank z) and the kernel adds them: each puts
// its sums in its threadgroup memory (`store_partial`), and after the cluster's barrier adds, for
// its share of the tile, every threadgroup's sums in the same order 0, 1, ... (reading the others'
// memory) and stores y, rounded once (`sum_cluster_parts`). Either way an element's order comes
// from K and K_SPLIT alone, never from M, and the two give the same bits.
//
// Bounds. Rows of x past M (or outside the run) are zeros in the tiles and nothing is read for
// them; weight rows past N are decoded from zero words (never read) with the first row's scales,
// into columns of y never stored, and those of a pick outside the batches as zeros (zero scales).
// K is a multiple of 64 (the route's), so every step is whole. Nothing is written past M or N.
//
// GATHER: row i of x uses weight batch picks[i] of ints[3] batches (w, scales and biases hold the
// batches one after another); a tile's rows run in turn by runs of equal picks (qmm.h's way). The
// tiles are the table `tile_starts` gives (threadgroup t: rows tile_starts[t] .. tile_starts[t + 1],
// at most BM): for sorted picks each run of one batch in tiles of its own, so a tile runs once.
//
// Runtime sizes (the `ints` buffer): M, N, K (, the batches). Defines: TX (x; 16-bit), TS, TY, BITS
// (2, 4, 8), GROUP, MODE, GATHER, WARPGROUPS, BM (16, 32, 64, 128, 256), BN (64 * WARPGROUPS), BK (64), K_SPLIT,
// SPLIT_SUM (0 or 1), STAGES (at least 3), LOAD_WORDS (quant_codes.h's: a stage's chunk in vector loads), PAIRS (quant_codes.h), CLOCK_PROBE (optional, `tools/dequantize_probe.py
// --clocks`: threadgroup (0, 0) writes its SIMD groups' clocks a part of the steps over y's first
// words, as PROBE_MARK says), from `kernels/quant.py`, which launches 128 * WARPGROUPS threads with
// STAGES * (BM * 128 + BN * 8 * BITS) + 1024 bytes of dynamic threadgroup memory over the grid
// (row tiles of x, tiles of weight rows, K_SPLIT parts of K): the row tiles of one weight tile run
// together, so w is read from memory about once.

#if BK != 64 || BN != 64 * WARPGROUPS || (BM != 16 && BM != 32 && BM != 64 && BM != 128 && BM != 256) || STAGES < 3 || \
    (BITS != 2 && BITS != 4 && BITS != 8) || K_SPLIT < 1 || (K_SPLIT > 1 && GATHER) || (SPLIT_SUM && (K_SPLIT < 2 || K_SPLIT > 8))
#error "qmm_wgmma_rs.h: BK 64, BN 64 per warpgroup, BM 16-256, at least 3 stages, 2, 4 or 8 bits, K split without gathers, summed in clusters of 2-8"
#endif
#define THREADS (128 * WARPGROUPS)
#define ROW_BYTES 128                              // an x tile row: BK 16-bit elements
#define X_BYTES (BM * ROW_BYTES)                   // a stage's x tile ...
#define WORD_ROW_BYTES (8 * BITS)                  // ... a weight row's words of a step (2 chunks) ...
#define CHUNK_BYTES (4 * BITS)
#define STAGE_BYTES (X_BYTES + BN * WORD_ROW_BYTES)  // ... and the stage (a multiple of 1024 bytes)
#define X_ROWS_A_PASS (THREADS / 8)                // x rows copied at once (8 pieces a row)
#define X_COPIES (BM / X_ROWS_A_PASS)
#define WORD_COPIES_A_ROW (WORD_ROW_BYTES / 16)
#define WORD_COPIES ((BN * WORD_COPIES_A_ROW + THREADS - 1) / THREADS)
#if BM % X_ROWS_A_PASS != 0 || STAGE_BYTES % 1024 != 0
#error "qmm_wgmma_rs.h: every thread copies whole rows' pieces of x; stages at multiples of 1024 bytes"
#endif
#define ACCUMULATORS (BM / 2)
// A weight row's scale groups of a step: BK / GROUP, or the one group spanning it. A row's groups
// (K / GROUP, K a multiple of BK) and a step's first are multiples of their count, so the load is aligned.
#define STEP_GROUPS (GROUP < BK ? BK / GROUP : 1)
struct alignas(STEP_GROUPS * sizeof(TS)) StepGroups {
  TS group[STEP_GROUPS];
};

// The probe's clocks: PROBE_MARK(I) adds the clocks since the last mark to part I (0 the step's
// start, 1 the stage's barrier, 2 the copies' issue, 3 the decoding, 4 the scales' loads, 5 the
// products' issue, 6 the wait for the step before's products).
#if CLOCK_PROBE
#define PROBE_PARTS 7
INLINE uint probe_clock() {
  uint now;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(now)::"memory");
  return now;
}
#define PROBE_MARK(I)                   \
  {                                     \
    const uint now = probe_clock();     \
    probe[I] += now - probe_last;       \
    probe_last = now;                   \
  }
#else
#define PROBE_MARK(I)
#endif

// This thread's accumulators (its warpgroup's 64 weight rows x BM rows of x, yᵀ's fragment: row
// `w_row` and + 8 of weight rows, x rows 8 j + 2 (lane % 4) and + 1) into y [M, n_size] for the x rows
// row_begin <= row < row_end, rounded once. Lanes lane and lane ^ 4 hold neighbouring weight rows:
// each gives the other one value, so that each stores two neighbouring columns of one row of y.
template <typename T> INLINE void store_transposed(const float* acc, DEVICE T* y, int x_row_first, int w_row, int lane,
                                                   int row_begin, int row_end, int n_size) {
  const bool even = (lane / 4) % 2 == 0;
#pragma unroll
  for (int i = 0; i < ACCUMULATORS; i += 2) {
    const float given = simd_shuffle_xor(even ? acc[i + 1] : acc[i], 4);
    const int row = x_row_first + 8 * (i / 4) + (even ? 0 : 1);
    const int column = w_row + 8 * ((i % 4) / 2) - (even ? 0 : 1);
    if (row < row_begin || row >= row_end) continue;
    store_row_pair(even ? acc[i] : given, even ? given : acc[i + 1], y + (size_t)row * n_size + column, column, n_size);
  }
}

#if SPLIT_SUM
// A threadgroup's partial sums of its tile in its threadgroup memory (over the stages): BM rows of
// x by BN weight rows, PARTIAL_STRIDE floats a row, so that a SIMD group's stores of one
// accumulator (rows 2 (lane % 4) + const, columns lane / 4 + const) fall in 32 distinct banks.
#define PARTIAL_STRIDE (BN + 4)
#if STAGES * STAGE_BYTES < BM * PARTIAL_STRIDE * 4
#error "qmm_wgmma_rs.h: the partial sums fit the stages"
#endif
// This thread's accumulators (`store_transposed`'s layout: accumulator i at x row 2 (lane % 4) +
// 8 (i / 4) + i % 2 of the tile, weight row a_row + 8 ((i % 4) / 2)) into `partial`.
INLINE void store_partial(const float* acc, float* partial, int a_row, int quad_lane) {
#pragma unroll
  for (int i = 0; i < ACCUMULATORS; i++)
    partial[(2 * quad_lane + 8 * (i / 4) + i % 2) * PARTIAL_STRIDE + a_row + 8 * ((i % 4) / 2)] = acc[i];
}
// The cluster's K_SPLIT parts of this threadgroup's share of the tile (rank `rank`: the rank-th of
// K_SPLIT even runs of its BM x BN / 4 pieces of four columns), added in order part 0, 1, ... (the
// threadgroups' `partial`, read across the cluster) and stored into y [M, n_size] for the x rows
// row_begin <= row < row_end (m_first the tile's first) and the columns below n_size, rounded once.
INLINE void sum_cluster_parts(const float* partial, int rank, DEVICE TY* y, int m_first, int n_first, int row_begin,
                              int row_end, int n_size, int thread_id) {
  const int pieces = BM * BN / 4, first = rank * pieces / K_SPLIT, end = (rank + 1) * pieces / K_SPLIT;
  for (int piece = first + thread_id; piece < end; piece += THREADS) {
    const int row = m_first + piece / (BN / 4), column = 4 * (piece % (BN / 4));
    if (row < row_begin || row >= row_end) continue;
    const float* at = partial + (row - m_first) * PARTIAL_STRIDE + column;
    float4 total = cluster_load4(at, 0);
#pragma unroll
    for (int part = 1; part < K_SPLIT; part++) {
      const float4 sums = cluster_load4(at, part);
      total.x += sums.x;
      total.y += sums.y;
      total.z += sums.z;
      total.w += sums.w;
    }
    DEVICE TY* out = y + (size_t)row * n_size + n_first + column;
    store_row_pair(total.x, total.y, out, n_first + column, n_size);
    store_row_pair(total.z, total.w, out + 2, n_first + column + 2, n_size);
  }
}
#endif

// Where this lane's pair of codes of part p (codes 8 p .. 8 p + 7 of a chunk; the A fragment's k
// 2 c, 2 c + 1, c = lane % 4) sits: bit BITS (8 p + 2 c) of the chunk, so word PART_WORD(p) (+ c / 2
// at 8 bits: `high_word`) at shift PART_SHIFT(p) + (2 BITS c) % 32 (`lane_shift`).
#define PART_WORD(P) (BITS * 8 * (P) / 32)
#define PART_SHIFT(P) (BITS * 8 * (P) % 32)

// This thread's A fragment of a step (a[kb] for k 16 kb .. 16 kb + 15: chunk kb / 2, parts 2 (kb %
// 2) and + 1; registers 0, 1 rows a_row and + 8 at codes 2 c, 2 c + 1 of the first part, 2, 3 of
// the second) dequantized from the stage's words `words` with the step's scales (and biases). Rows
// that are out have zero words (`LOAD_SCALES` says what scales).
INLINE void dequantize_fragment(const unsigned char* words, int a_row, int lane_shift, bool high_word,
                                const TS (*scale_raw)[SCALES_PER_CHUNK], const TS (*bias_raw)[SCALES_PER_CHUNK], uint (*a)[4]) {
#if PAIRS
  const uint pair_bytes = (uint)(lane_shift / 8) * 0x101u + 0x400u;  // bytes c of the word and of the word >> 4
#endif
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const unsigned char* row_words = words + (a_row + 8 * h) * WORD_ROW_BYTES;
#pragma unroll
    for (int j = 0; j < 2; j++) {
      uint chunk[BITS];
      load_chunk_words((const uint*)(row_words + j * CHUNK_BYTES), false, chunk);  // LOAD_WORDS a load
#pragma unroll
      for (int p = 0; p < 4; p++) {
#if BITS == 8
        const uint word = high_word ? chunk[PART_WORD(p) + 1] : chunk[PART_WORD(p)];
#else
        const uint word = chunk[PART_WORD(p)];
#endif
        const int g = p * SCALES_PER_CHUNK / 4;  // the part's group of the chunk
#if PAIRS
        // 4 bits: the lane's pair is byte lane_shift / 8 of the word, its codes to bits 0-3 and
        // 16-19 (`code_pair`) by one byte permute of the word and the word shifted by a code
        const uint codes = byte_perm(word, word >> 4, pair_bytes);
#if MODE == 0
        const uint bias2 = both_halves(bias_raw[2 * h + j][g]);
#else
        const uint bias2 = PAIR_NEGATIVE_ZERO;  // unused
#endif
        a[2 * j + p / 2][2 * (p % 2) + h] = code_pair<TX>(codes, pair_scale<TX>(scale_raw[2 * h + j][g]), bias2);
#else
        float q[2];
        decode_pair(word >> (PART_SHIFT(p) + lane_shift), q);
        const float scale = group_scale(scale_raw[2 * h + j][g]);
#if MODE == 0
        scale_codes(q, 2, scale, to_float(bias_raw[2 * h + j][g]));
#else
        scale_code_values(q, 2, scale);
#endif
        a[2 * j + p / 2][2 * (p % 2) + h] = pack_pair(q[0], q[1], TX());
#endif
      }
    }
  }
}

// Keeps a fragment's registers live (unchanged) up to here: the products that read them are retired.
INLINE void hold_fragment(uint (*a)[4]) {
#pragma unroll
  for (int kb = 0; kb < 4; kb++)
#pragma unroll
    for (int r = 0; r < 4; r++) wgmma_hold(a[kb][r]);
}

/* kernel */
  const int m_size = ints[0], n_size = ints[1], k_size = ints[2];
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32, quad_lane = lane % 4;
  const int warpgroup = thread_id / 128, warp = (thread_id / 32) % 4;
  TILE_ROWS(m_first, tile_end, nv_group.x, m_size)  // gathered: the tile table's
  const int n_first = (int)nv_group.y * BN;
  // This threadgroup's steps of K: all of them, or its part (K_SPLIT), whose sums go to y's part.
#if K_SPLIT > 1
  const int split = (int)nv_group.z, step_first = split * (k_size / BK) / K_SPLIT;
  const int steps = (split + 1) * (k_size / BK) / K_SPLIT - step_first;
#if !SPLIT_SUM
  y += (size_t)split * m_size * n_size;
#endif
#else
  const int step_first = 0, steps = k_size / BK;
#endif
  const size_t words_per_row = (size_t)k_size / 32 * BITS;
  const int groups_per_row = k_size / GROUP;
  // This thread's two weight rows of the tile (the A fragment's rows lane / 4 and + 8).
  const int a_row = 64 * warpgroup + 16 * warp + lane / 4;

  // The stages, from the first multiple of 1024 bytes of the dynamic memory: x's tile, then the words.
  DYNAMIC_THREADGROUP(dynamic_memory, STAGES * STAGE_BYTES + 1024);
  unsigned char* stages = (unsigned char*)dynamic_memory + ((1024u - (shared_address(dynamic_memory) & 1023u)) & 1023u);

  // This thread's x copies: piece `piece` of tile rows thread_id / 8 + X_ROWS_A_PASS * c, stored at
  // piece piece ^ (row % 8) (row % 8 the same for all). Its words' copies: 16-byte pieces
  // thread_id + THREADS * c of the step's BN * WORD_COPIES_A_ROW.
  const int piece = thread_id % 8, first_row = thread_id / 8;
  const int swizzled_piece = 16 * (piece ^ (first_row % 8));
  const int lane_shift = 2 * BITS * quad_lane % 32;  // `PART_WORD`
  const bool high_word = BITS == 8 && quad_lane >= 2;

  for (int run_start = m_first; run_start < tile_end;) {
    QUANT_RUN(run_start, tile_end, n_size)  // the tile's rows in runs of one weight batch
    // The x rows this thread copies (m_first + first_row + X_ROWS_A_PASS * c) that are in the run,
    // as bits; the rows' addresses are computed at each copy (a pointer each would take registers).
    uint x_in = 0;
#pragma unroll
    for (int c = 0; c < X_COPIES; c++) {
      const int row = m_first + first_row + X_ROWS_A_PASS * c;
      if (row >= run_start && row < run_end) x_in |= 1u << c;
    }
    const DEVICE TX* const x_first = x + (size_t)(m_first + first_row) * k_size + step_first * BK + 8 * piece;
    const DEVICE uint* w_from[WORD_COPIES];
    bool w_in[WORD_COPIES];
    int w_to[WORD_COPIES];
#pragma unroll
    for (int c = 0; c < WORD_COPIES; c++) {
      const int copy = thread_id + THREADS * c, row = copy / WORD_COPIES_A_ROW;
      w_in[c] = batch_real && copy < BN * WORD_COPIES_A_ROW && n_first + row < n_size;
      w_to[c] = X_BYTES + copy * 16;
      w_from[c] = w + (first_w_row + (w_in[c] ? n_first + row : 0)) * words_per_row + (size_t)step_first * 2 * BITS +
                  (copy % WORD_COPIES_A_ROW) * 4;
    }
    // This thread's weight rows (a_row, a_row + 8): in or not, and their scales (and biases).
    bool row_in[2];
    const DEVICE TS* scale_rows[2];
#if MODE == 0
    const DEVICE TS* bias_rows[2];
#endif
#pragma unroll
    for (int h = 0; h < 2; h++) {
      row_in[h] = batch_real && n_first + a_row + 8 * h < n_size;
      const size_t row_groups = (first_w_row + (row_in[h] ? n_first + a_row + 8 * h : 0)) * groups_per_row;
      scale_rows[h] = scales + row_groups;
#if MODE == 0
      bias_rows[h] = biases + row_groups;
#endif
    }
// The copies of step STEP into its stage buffer, as one group (zeros for x rows that are out).
#define COPY_STEP(STEP)                                                                               \
  {                                                                                                   \
    unsigned char* stage = stages + ((STEP) % STAGES) * STAGE_BYTES;                                  \
    _Pragma("unroll") for (int c = 0; c < X_COPIES; c++) {                                            \
      const bool in = (x_in >> c) & 1u;                                                               \
      async_copy16(stage + swizzled_piece + (first_row + X_ROWS_A_PASS * c) * ROW_BYTES,              \
                   in ? x_first + (size_t)c * X_ROWS_A_PASS * k_size + (STEP) * BK : x, in);          \
    }                                                                                                 \
    _Pragma("unroll") for (int c = 0; c < WORD_COPIES; c++) {                                         \
      if ((BN * WORD_COPIES_A_ROW) % THREADS != 0 && thread_id + THREADS * c >= BN * WORD_COPIES_A_ROW) break; \
      async_copy16(stage + w_to[c], w_in[c] ? w_from[c] + (size_t)(STEP) * 2 * BITS : w_from[c], w_in[c]); \
    }                                                                                                 \
    async_commit();                                                                                   \
  }
// The scales (and biases) of this thread's rows at step STEP: each chunk's SCALES_PER_CHUNK groups.
// A row's groups of a step (STEP_GROUPS of them, `StepGroups`) come in one aligned load, the
// chunks' groups taken from it at fixed places (the compiler merges no loads itself). Weight rows
// past N take the first row's (their columns of y are never stored); a pick outside the batches
// takes zeros, so that its rows of y are zeros.
#if GATHER
#define GROUPS_OR_ZERO(H, AT) (row_in[H] ? *(const DEVICE StepGroups*)(AT) : StepGroups{})
#else
#define GROUPS_OR_ZERO(H, AT) (*(const DEVICE StepGroups*)(AT))
#endif
#if MODE == 0
#define IF_AFFINE(CODE) CODE
#else
#define IF_AFFINE(CODE)
#endif
#define LOAD_SCALES(STEP)                                                                             \
  _Pragma("unroll") for (int h = 0; h < 2; h++) {                                                     \
    const int first = (step_first + (STEP)) * BK / GROUP;                                             \
    const StepGroups step_scales = GROUPS_OR_ZERO(h, scale_rows[h] + first);                          \
    IF_AFFINE(const StepGroups step_biases = GROUPS_OR_ZERO(h, bias_rows[h] + first);)                \
    _Pragma("unroll") for (int j = 0; j < 2; j++)                                                     \
      _Pragma("unroll") for (int g = 0; g < SCALES_PER_CHUNK; g++) {                                  \
        scale_raw[2 * h + j][g] = step_scales.group[(32 * j + CHUNK_GROUP * g) / GROUP];              \
        IF_AFFINE(bias_raw[2 * h + j][g] = step_biases.group[(32 * j + CHUNK_GROUP * g) / GROUP];)    \
      }                                                                                               \
  }

    float acc[ACCUMULATORS];
#pragma unroll
    for (int i = 0; i < ACCUMULATORS; i++) acc[i] = 0.0f;
    TS scale_raw[4][SCALES_PER_CHUNK];  // row a_row + 8 h, chunk j at 2 h + j
#if MODE == 0
    TS bias_raw[4][SCALES_PER_CHUNK];
#endif
#pragma unroll
    for (int step = 0; step < STAGES - 2; step++) {
      if (step < steps) COPY_STEP(step) else async_commit();
    }
    LOAD_SCALES(0)
// Step STEP with A fragment buffer BUF: the wgmma read their A registers while they run, so a
// fragment must stay untouched until the wait that retires its step, one step later; the hold
// after that wait keeps the compiler from giving the other buffer's registers (step STEP - 1's,
// retired only now) to anything sooner.
#define REGISTER_STEP(STEP, BUF)                                                                      \
  {                                                                                                   \
    PROBE_MARK(0)                                                                                     \
    wgmma_stage_ready<STAGES - 3>();  /* step's copies everyone's; stage step - 2 free */             \
    PROBE_MARK(1)                                                                                     \
    if ((STEP) + STAGES - 2 < steps) COPY_STEP((STEP) + STAGES - 2) else async_commit();              \
    PROBE_MARK(2)                                                                                     \
    const unsigned char* stage = stages + ((STEP) % STAGES) * STAGE_BYTES;                            \
    dequantize_fragment(stage + X_BYTES, a_row, lane_shift, high_word, scale_raw, BIASES, a[BUF]);  \
    PROBE_MARK(3)                                                                                     \
    if ((STEP) + 1 < steps) LOAD_SCALES((STEP) + 1)                                                   \
    PROBE_MARK(4)                                                                                     \
    wgmma_fence();                                                                                    \
    _Pragma("unroll") for (int kb = 0; kb < 4; kb++) wgmma_tile_rs_rows<BM>(acc, a[BUF][kb], (const TX*)stage, kb); \
    wgmma_commit();                                                                                   \
    PROBE_MARK(5)                                                                                     \
    wgmma_wait<1>();                                                                                  \
    PROBE_MARK(6)                                                                                     \
    _Pragma("unroll") for (int i = 0; i < ACCUMULATORS; i++) wgmma_hold(acc[i]);                      \
    hold_fragment(a[1 - (BUF)]);                                                                      \
  }
#if MODE == 0
#define BIASES bias_raw
#else
#define BIASES scale_raw
#endif
    uint a[2][4][4] = {};  // two steps' A fragments (`dequantize_fragment`); zeros: step 0 holds the unused one
#if CLOCK_PROBE
    uint probe[PROBE_PARTS] = {}, probe_last = probe_clock();
    const uint probe_start = probe_last;
#endif
    int step = 0;
    for (; step + 1 < steps; step += 2) {
      REGISTER_STEP(step, 0)
      REGISTER_STEP(step + 1, 1)
    }
    if (step < steps) REGISTER_STEP(step, 0)  // an odd count's last step
    wgmma_finish<BM>(acc);
    hold_fragment(a[0]);
    hold_fragment(a[1]);
    async_wait(0);  // only empty groups are left: none outlives the run

#if SPLIT_SUM
    threadgroup_barrier();  // every warpgroup's products are done with the stages the sums go over
    store_partial(acc, (float*)stages, a_row, quad_lane);
    cluster_barrier();      // every part's sums in place, seen across the cluster
    sum_cluster_parts((const float*)stages, split, y, m_first, n_first, run_start, run_end, n_size, thread_id);
    cluster_barrier_relaxed();  // no threadgroup leaves while another reads its memory
#else
    store_transposed(acc, y, m_first + 2 * quad_lane, n_first + a_row, lane, run_start, run_end, n_size);
    threadgroup_barrier();  // every thread is done with the stages before the next run fills them
#endif
#if CLOCK_PROBE
    // Over the stores: each SIMD group's parts, then its clocks from the main loop's start to here.
    if (nv_group.x == 0 && nv_group.y == 0 && lane == 0 && run_start == m_first) {
      DEVICE uint* words_out = (DEVICE uint*)y + 8 * (thread_id / 32);
#pragma unroll
      for (int i = 0; i < PROBE_PARTS; i++) words_out[i] = probe[i];
      words_out[PROBE_PARTS] = probe_clock() - probe_start;
    }
#endif
    run_start = run_end;
  }

// The quantized matrix-matrix product for many rows (prefill), y [M, N] = x [M, K] · wᵀ over packed
// weights (`quant_codes.h`), on Hopper's warpgroup matrix products (wgmma, CUDA sm_90a only),
// warp-specialised: qmm_wgmma.h's product with the decoding taken off the warpgroups that issue the
// products, so that the tensor cores run while the weights of the next steps are decoded.
//
// A threadgroup is WARPGROUPS consumer warpgroups and PRODUCERS producer warpgroups (128 * (WARPGROUPS +
// PRODUCERS) threads). The consumers compute a BM x BN tile of y (BM = 64 * WARPGROUPS, each warpgroup 64 rows
// by all BN columns in its registers) in steps of BK = 64 along K, and do nothing else. The producer
// feeds them through STAGES buffers, each the step's x tile (BM x 64) and its dequantized w tile (BN
// x 64), both swizzled 128-byte rows as the tensor cores read them (the prelude's layout):
// - x by asynchronous copies (cp.async), AHEAD = STAGES - 2 steps ahead;
// - w's packed words by loads into the producer's registers (their scales as vectors, below), issued
//   two steps ahead where a thread's chunks of a step take at most 16 words (WORDS_AHEAD; else the step after the one
//   decoding) and copied forward a step later, so each load has about a step to land (a form in
//   which two sets took the steps in turn, each load two steps, measured slower: quant_h200.md),
//   each thread one chunk (32 codes) of ROWS weight rows, the two threads of a lane pair the two
//   chunks of the same rows: a warp's loads of a step then touch 16 rows' lines, not 32 (the
//   producer's loads queue behind the L1's tag lookups, one a line an instruction: quant_h200.md),
//   decoded (scale · code + bias, or the floating-point modes' code · scale; rounded once, as
//   qmm_wgmma.h) into the buffer's w tile in x's type.
// Two staging barriers a buffer (the prelude's mbarrier) order them: `full` completes when every
// producer thread has written the step (its copies waited for, then the async-proxy fence, so that
// the tensor cores see them) and `empty` when every consumer thread has waited for the step's
// products. A buffer's phases follow the steps: step g (counted over the tile's runs) is phase
// g / STAGES of buffer g % STAGES, and the producer refills a buffer for step g only after step
// g - STAGES retired, so no barrier is ever more than one phase ahead of a thread waiting on it.
//
// Bits. Every element of y sums its K products in steps of 16 along K in increasing order into one
// float32 accumulator, the weights rounded to TX first, whatever BM, BN, STAGES, the grid or M: the
// bits of qmm_wgmma.h and of the dequantized route. A row's bits never depend on M or the tiles.
//
// Bounds. Rows of x past M (or outside the run), weight rows past N (or of a pick outside the
// batches) are zeros and nothing is read for them; K is a multiple of 64 (the route's), so every
// step is whole.
//
// GATHER: row i of x uses weight batch picks[i] of ints[3] batches (w, scales and biases hold the
// batches one after another); a tile's rows run in turn by runs of equal picks, the tiles from the
// table `tile_starts` (qmm_wgmma.h's way).
//
// Registers. With more than 256 threads the launch bound leaves each thread 65536 / threads; where
// PRODUCER_REGISTERS is set the producers give theirs down to it and the consumers take theirs up to
// CONSUMER_REGISTERS (their accumulators: BN / 2 a thread), the total unchanged.
//
// Runtime sizes (the `ints` buffer): M, N, K (, the batches). Defines: TX (x; 16-bit), TS, TY, BITS,
// GROUP, MODE, GATHER, WARPGROUPS, PRODUCERS (1 or 2), BM, BN (128 or 256), BK (64), STAGES (at least
// 3), LOAD_WORDS, PRODUCER_REGISTERS and CONSUMER_REGISTERS (0: unchanged), SCALE_VECTORS (1: K / GROUP a
// multiple of 4, scales a vector load), PAIRS (quant_codes.h), from `kernels/quant.py`,
// which launches 128 * (WARPGROUPS + PRODUCERS) threads with STAGES * ((BM + BN) * 128 + 16) + 1024
// bytes of dynamic threadgroup memory over the grid (row tiles, column tiles).

#if BK != 64 || BM != 64 * WARPGROUPS || (BN != 128 && BN != 256) || STAGES < 3 || (2 * BN) % (128 * PRODUCERS) != 0 || GROUP % 16 != 0
#error "qmm_wgmma_ws.h: BK 64, BM 64 per warpgroup, BN 128 or 256 (two chunks a row, a multiple of the producers), at least 3 stages, groups of 16s"
#endif
#define CONSUMER_THREADS (128 * WARPGROUPS)
#define PRODUCER_THREADS (128 * PRODUCERS)
#define ROW_BYTES 128                              // a tile row: BK 16-bit elements
#define X_BYTES (BM * ROW_BYTES)                   // a buffer's x tile, then ...
#define STAGE_BYTES (X_BYTES + BN * ROW_BYTES)     // ... its w tile
#define AHEAD (STAGES - 2)                         // steps whose x copies are in flight
#define X_ROWS_A_PASS (PRODUCER_THREADS / 8)       // x rows copied at once (8 pieces a row)
#define X_COPIES (BM / X_ROWS_A_PASS)
#define ROWS (2 * BN / PRODUCER_THREADS)           // weight rows of which a producer thread decodes one chunk
#define ROWS_APART (PRODUCER_THREADS / 2)          // between a producer thread's rows
#define WORDS_AHEAD (ROWS * BITS <= 16 ? 2 : 1)    // steps of words in a producer's registers (within its registers)
#define ACCUMULATORS (BN / 2)

// A producer thread's chunk of a step of each of its weight rows, in registers (zeros for a row
// that is out).
struct StepWords {
  uint words[ROWS][BITS];
};

// A vector: consecutive groups' scales (or biases) of a weight row in one 64-bit word, the first
// lowest (VECTOR_GROUPS of them: 4, or 2 of 32-bit scales), one load where a row's groups are a
// multiple of VECTOR_GROUPS (SCALE_VECTORS: every vector then whole and aligned), else group by
// group. A vector serves STEPS_A_VECTOR steps of BK codes, so a producer thread loads a row's
// scales once in that many steps, not once a step (the loads' L1 tag lookups pace the producer:
// quant_h200.md). The thread shifts its vector down a step's groups at a time, so that the chunk's
// group h is always the vector's group (the chunk's first) + h, a constant: no register is picked by
// a runtime index (which the compiler would put in local memory).
typedef unsigned long long ScaleVector;
#define SCALE_BITS (8 * (int)sizeof(TS))
#define VECTOR_GROUPS (sizeof(TS) == 4 ? 2 : 4)
#define STEPS_A_VECTOR (VECTOR_GROUPS * GROUP / BK)

// Groups first_group .. first_group + VECTOR_GROUPS - 1 of a row (`row`: its first group; `groups`
// a row), zeros past the row.
INLINE ScaleVector load_scale_vector(const DEVICE TS* row, int first_group, int groups) {
#if SCALE_VECTORS
  if (sizeof(TS) == 1) return *(const DEVICE uint*)(row + first_group);
  return *(const DEVICE ScaleVector*)(row + first_group);
#else
  ScaleVector vector = 0ull;
#pragma unroll
  for (int i = 0; i < VECTOR_GROUPS; i++)
    if (first_group + i < groups) vector |= (ScaleVector)to_bits(row[first_group + i]) << (SCALE_BITS * i);
  return vector;
#endif
}

// Group `at` (a constant) of a vector.
INLINE TS vector_group(ScaleVector vector, int at) {
  TS value;
  from_bits((uint)(vector >> (SCALE_BITS * at)), &value);
  return value;
}

/* kernel */
  const int m_size = ints[0], n_size = ints[1], k_size = ints[2];
  const int thread_id = (int)nv_thread.x;
  TILE_ROWS(m_first, tile_end, nv_group.x, m_size)  // gathered: the tile table's
  const int n_first = (int)nv_group.y * BN;
  const int steps = k_size / BK;
  const size_t words_per_row = (size_t)k_size / 32 * BITS;
  const int groups_per_row = k_size / GROUP;

  // The buffers from the first multiple of 1024 bytes of the dynamic memory, then their barriers.
  DYNAMIC_THREADGROUP(dynamic_memory, STAGES * (STAGE_BYTES + 16) + 1024);
  unsigned char* stages = (unsigned char*)dynamic_memory + ((1024u - (shared_address(dynamic_memory) & 1023u)) & 1023u);
  unsigned long long* full = (unsigned long long*)(stages + STAGES * STAGE_BYTES);
  unsigned long long* empty = full + STAGES;
  if (thread_id < STAGES) {
    stage_barrier_init(&full[thread_id], PRODUCER_THREADS);
    stage_barrier_init(&empty[thread_id], CONSUMER_THREADS);
  }
  threadgroup_barrier();

  int g = 0;  // the steps of the tile's runs so far: step g uses buffer g % STAGES
  if (thread_id < CONSUMER_THREADS) {
    // A consumer: the products of each step, once the producer has filled its buffer.
#if PRODUCER_REGISTERS
    warpgroup_registers_more<CONSUMER_REGISTERS>();
#endif
    const int lane = thread_id % 32, warpgroup = thread_id / 128, warp = (thread_id / 32) % 4;
    for (int run_start = m_first; run_start < tile_end;) {
      const int run_end = RUN_END(run_start, tile_end);
      float acc[ACCUMULATORS];
#pragma unroll
      for (int i = 0; i < ACCUMULATORS; i++) acc[i] = 0.0f;
      for (int step = 0; step < steps; step++, g++) {
        stage_wait(&full[g % STAGES], (g / STAGES) % 2);
        const unsigned char* stage = stages + (g % STAGES) * STAGE_BYTES;
        wgmma_step<BN>(acc, (const TX*)(stage + warpgroup * 64 * ROW_BYTES), (const TX*)(stage + X_BYTES));
        if (step > 0) stage_arrive(&empty[(g - 1) % STAGES]);  // step - 1's products are done
      }
      wgmma_finish<BN>(acc);
      stage_arrive(&empty[(g - 1) % STAGES]);
      // Each thread's elements of y for the run's rows, rounded once.
      store_accumulators<BN>(acc, y, m_first + 64 * warpgroup + 16 * warp + lane / 4, n_first + 2 * (lane % 4), run_start, run_end,
                             n_size);
      run_start = run_end;
    }
  } else {
    // The producers: x's copies, then w's words decoded, step by step.
#if PRODUCER_REGISTERS
    warpgroup_registers_fewer<PRODUCER_REGISTERS>();
#endif
    const int producer = thread_id - CONSUMER_THREADS;
    // Its x copies: piece `piece` of tile rows producer / 8 + X_ROWS_A_PASS * c, stored at piece
    // piece ^ (row % 8) (row % 8 the same for all). Its weights: chunk `chunk` of tile rows
    // producer / 2 + ROWS_APART * r.
    const int piece = producer % 8, first_row = producer / 8, chunk = producer % 2;
    const int swizzled_piece = 16 * (piece ^ (first_row % 8));
    for (int run_start = m_first; run_start < tile_end;) {
      QUANT_RUN(run_start, tile_end, n_size)  // the tile's rows in runs of one weight batch
      const DEVICE TX* x_from[X_COPIES];
      bool x_in[X_COPIES];
      x_copy_sources<X_COPIES>(x, m_first, first_row, X_ROWS_A_PASS, piece, run_start, run_end, k_size, x_from, x_in);
      // Its row r is row first_w + ROWS_APART * r of w (batches one after another), read only where
      // row_in[r]; each load's address is made from row 0's and the rows' distance, which keeps
      // fewer registers than an address a row (those spilled at 3, 5 and 6 bits and nvfp4).
      const size_t first_w = first_w_row + n_first + producer / 2;
      const DEVICE uint* words_at = w + first_w * words_per_row + chunk * BITS;  // row 0's chunk
      const size_t words_apart = (size_t)ROWS_APART * words_per_row, groups_at = first_w * groups_per_row;
      const size_t groups_apart = (size_t)ROWS_APART * groups_per_row;
      bool row_in[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; r++) row_in[r] = batch_real && n_first + producer / 2 + ROWS_APART * r < n_size;
// The x copies of run step STEP (global step G) into its buffer, as one group, once the products
// of step G - STAGES, the buffer's last, are done. A row that is out copies nothing (zeros) from row 0's
// address, which every step's stays within.
#define COPY_X(G, STEP)                                                                               \
  {                                                                                                   \
    if ((G) >= STAGES) stage_wait(&empty[(G) % STAGES], ((G) / STAGES - 1) % 2);                      \
    unsigned char* stage = stages + ((G) % STAGES) * STAGE_BYTES;                                     \
    _Pragma("unroll") for (int c = 0; c < X_COPIES; c++)                                              \
      async_copy16(stage + swizzled_piece + (first_row + X_ROWS_A_PASS * c) * ROW_BYTES,              \
                   x_from[c] + (STEP) * BK, x_in[c]);                                                 \
  }
// Run step STEP's words of this thread's chunk of its rows into `into` (zeros for a row that is out).
#define LOAD_STEP(INTO, STEP)                                                                         \
  _Pragma("unroll") for (int r = 0; r < ROWS; r++) {                                                  \
    if (row_in[r]) {                                                                                  \
      load_chunk_words(words_at + r * words_apart + (size_t)(STEP) * 2 * BITS, false, INTO.words[r]); \
    } else {                                                                                          \
      _Pragma("unroll") for (int i = 0; i < BITS; i++) INTO.words[r][i] = 0u;                         \
    }                                                                                                 \
  }
// Vector VECTOR of its rows' scales (and biases) into scales_now (biases_now), zeros for a row that
// is out; or those vectors shifted down by GROUPS groups.
#if MODE == 0
#define LOAD_BIAS_VECTOR(R, FIRST) \
  biases_now[R] = row_in[R] ? load_scale_vector(biases + groups_at + R * groups_apart, FIRST, groups_per_row) : 0ull;
#define SHIFT_BIASES(R, GROUPS) biases_now[R] >>= SCALE_BITS * (GROUPS);
#else
#define LOAD_BIAS_VECTOR(R, FIRST)
#define SHIFT_BIASES(R, GROUPS)
#endif
#define LOAD_VECTORS(VECTOR)                                                                                                         \
  _Pragma("unroll") for (int r = 0; r < ROWS; r++) {                                                                                 \
    scales_now[r] = row_in[r] ? load_scale_vector(scales + groups_at + r * groups_apart, VECTOR_GROUPS * (VECTOR), groups_per_row) \
                              : 0ull;                                                                                                \
    LOAD_BIAS_VECTOR(r, VECTOR_GROUPS * (VECTOR))                                                                                    \
  }
#define SHIFT_VECTORS(GROUPS)                        \
  _Pragma("unroll") for (int r = 0; r < ROWS; r++) { \
    scales_now[r] >>= SCALE_BITS * (GROUPS);         \
    SHIFT_BIASES(r, GROUPS)                          \
  }

#pragma unroll
      for (int ahead = 0; ahead < AHEAD; ahead++) {
        if (ahead < steps) COPY_X(g + ahead, ahead)
        async_commit();
      }
      StepWords now;
      LOAD_STEP(now, 0)
#if WORDS_AHEAD == 2
      StepWords next;
      if (steps > 1) LOAD_STEP(next, 1)
#endif
      // The scales of the step's vector (steps STEPS_A_VECTOR * v ..), shifted down by the groups of
      // the vector's steps before; the next vector loaded into the same registers once the vector's
      // last step is decoded, a step before its first use.
      const int chunk_first_group = 32 * chunk / GROUP;  // in its step's groups
      ScaleVector scales_now[ROWS];
#if MODE == 0
      ScaleVector biases_now[ROWS];
#endif
      LOAD_VECTORS(0)
      for (int step = 0; step < steps; step++, g++) {
        async_wait(AHEAD - 1);  // this thread's copies of the step are done
        unsigned char* w_tile = stages + (g % STAGES) * STAGE_BYTES + X_BYTES;
        // The step's weights into the w tile: chunk `chunk` of row r as four 16-byte pieces of 8 codes.
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
          const int row = producer / 2 + ROWS_APART * r;
#pragma unroll
          for (int h = 0; h < SCALES_PER_CHUNK; h++) {
            const float scale = group_scale(vector_group(scales_now[r], chunk_first_group + h));
#if MODE == 0
            const float bias = to_float(vector_group(biases_now[r], chunk_first_group + h));
#else
            const float bias = 0.0f;
#endif
#pragma unroll
            for (int part = h * 4 / SCALES_PER_CHUNK; part < (h + 1) * 4 / SCALES_PER_CHUNK; part++)
              store_tile_part<TX>(now.words[r], part, scale, bias, w_tile, row, 4 * chunk + part);
          }
        }
        // The vectors on to the next step's groups, or the next vector after a vector's last step.
        if ((step + 1) % STEPS_A_VECTOR != 0) {
          SHIFT_VECTORS((step + 1) * BK / GROUP - step * BK / GROUP)
        } else if (step + 1 < steps) {
          LOAD_VECTORS((step + 1) / STEPS_A_VECTOR)
        }
        async_proxy_fence();  // the copies and the stores visible to the tensor cores
        stage_arrive(&full[g % STAGES]);
#if WORDS_AHEAD == 2
        now = next;
        if (step + 2 < steps) LOAD_STEP(next, step + 2)
#else
        if (step + 1 < steps) LOAD_STEP(now, step + 1)
#endif
        if (step + AHEAD < steps) COPY_X(g + AHEAD, step + AHEAD)
        async_commit();
      }
      async_wait(0);  // only empty groups are left: none outlives the run
      run_start = run_end;
    }
  }

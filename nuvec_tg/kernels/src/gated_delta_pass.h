// The gated delta rule's chunked prefill, second pass: the state carried from chunk to chunk.
//
// A threadgroup serves 16 * WARPS value rows of one value head's state (`[DV, DK]`) of one batch
// item; each SIMD group keeps its 16 rows, S, in float32 accumulators for the whole call. With the
// first pass's w, u, within and c of a chunk (gated_delta_chunks.h), per chunk:
//
//     v' = u - S wᵀ                                       [16, CHUNK]  (rows: value rows; columns: steps)
//     y  = (S qᵀ) diag(2^c) + v' withinᵀ                  the chunk's outputs
//     S  = 2^c_last S + (v' diag(2^(c_last - c))) K        the state after the chunk
//
// every product on the matrix units, S and v' rounded to T as their A operands (float32 kept in
// the accumulators). The chunks' w, Q and K go through STAGES threadgroup buffers in turn (and
// within through two), each copied while the products of the STAGES - 1 before it run; u and the
// decays are read into registers a chunk ahead. Steps past the last
// compute on zeros and store nothing. A row's arithmetic depends on the sizes and its own
// inputs only: its bits do not depend on the batch.
//
// Variants: the final state (state_in -> state_out), or a pool read and written in place at
// `slots[batch]` (SLOTS; a slot outside the pool reads zeros, writes nothing and gives zero outputs).
// v, g and beta are parameters only for the backward (the composition's gradient reaches them
// through this call); the first pass has read them.
// Defines: T (q, k, v and y's type), TS (the state's or pool's), DK, DV, HK, HV, CHUNK, WARPS, STAGES
// (line buffers, 2 or more), SLOTS.
// Runtime integers (`ints`): the steps, and the pool's slots (SLOTS).

#define THREADS (WARPS * 32)
#define LDK (DK + 8)
#define LDW (CHUNK + 8)
#define S_TILES (DK / 8)      // 8-column accumulators of a SIMD group's state rows
#define STEP_TILES (CHUNK / 8)

#if CHUNK % 16 != 0 || DK % 16 != 0
#error "gated_delta_pass.h: CHUNK and DK must be multiples of 16"
#endif

// The lines of a chunk, CHUNK of DK elements each, into TO: line r from `FIRST_LINE + r * LINE_STRIDE`,
// or zeros where CHECKED and step FIRST_STEP + r is past the last. A thread's pieces (their lines
// and columns) are the same in every chunk: the loop is unrolled so that only the chunk's start varies.
#define COPY_PASSES ((CHUNK * (DK / 8) + THREADS - 1) / THREADS)
#define COPY_CHUNK(TO, BUFFER, FIRST_LINE, LINE_STRIDE, CHECKED, FIRST_STEP)                        \
  _Pragma("unroll") for (int pass = 0; pass < COPY_PASSES; pass++) {                                \
    const int i = thread_id + pass * THREADS, r = i / (DK / 8), piece = i % (DK / 8);                 \
    if (CHUNK * (DK / 8) % THREADS == 0 || i < CHUNK * (DK / 8)) {                                  \
      const bool present = !(CHECKED) || (FIRST_STEP) + r < steps;                                  \
      async_copy16((TO) + r * LDK + piece * 8, present ? (FIRST_LINE) + (size_t)r * (LINE_STRIDE) + piece * 8 : (BUFFER), present); \
    }                                                                                               \
  }

// acc = S Lᵀ for a chunk's lines L at `lines` (w's or Q's, row stride LDK), S given as its A
// fragments: an accumulator per 8 steps.
INLINE void state_times_lines(THREAD TileAcc* acc, const THREAD TileA<T>* s_a, const THREADGROUP_PTR T* lines, int lane) {
#pragma unroll
  for (int j = 0; j < STEP_TILES; j++) tile_zero(acc[j]);
#pragma unroll
  for (int kk = 0; kk < DK / 16; kk++) {
#pragma unroll
    for (int j = 0; j < STEP_TILES; j += 2) {
      TileB<T> b0, b1;
      load_tile_b2(b0, b1, lines + j * 8 * LDK + kk * 16, LDK, lane);
      tile_mma(acc[j], s_a[kk], b0);
      tile_mma(acc[j + 1], s_a[kk], b1);
    }
  }
}

/* kernel */
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32, warp = thread_id / 32;
  const int row0 = ((int)nv_group.x * WARPS + warp) * 16, head = (int)nv_group.y, batch = (int)nv_group.z;
  const int key_head = head / (HV / HK), steps = ints[0], chunks = (steps + CHUNK - 1) / CHUNK;
  const size_t head_at = (size_t)batch * HV + head;  // (batch, head) among the first pass's outputs
#if SLOTS
  const int slot = slots[batch];
  const bool live = slot >= 0 && slot < ints[1];
  const size_t state_at = ((size_t)(live ? slot : 0) * HV + head) * DV;
  const DEVICE TS* state_in = pool;
#else
  const bool live = true;
  const size_t state_at = head_at * DV;
#endif

  THREADGROUP uint4 stage_memory[STAGES * CHUNK * LDK * sizeof(T) / 16];  // uint4: the copies' 16-byte alignment
  THREADGROUP uint4 within_memory[2 * CHUNK * LDW * sizeof(T) / 16];
  THREADGROUP_PTR T* stage = (THREADGROUP_PTR T*)stage_memory;
  THREADGROUP_PTR T* within_tiles = (THREADGROUP_PTR T*)within_memory;

  // This lane's state rows (frag_row and + 8) and whether they are real.
  const int my_row[2] = {row0 + frag_row(lane), row0 + frag_row(lane) + 8};
  TileAcc s[S_TILES];
#pragma unroll
  for (int n = 0; n < S_TILES; n++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const bool real = live && my_row[h] < DV;  // a dead slot's rows, or rows past DV, may lie outside the buffer
      const DEVICE TS* at = state_in + (state_at + (real ? my_row[h] : 0)) * DK + n * 8 + frag_col(lane);
      s[n].v[2 * h] = real ? to_float(at[0]) : 0.0f;
      s[n].v[2 * h + 1] = real ? to_float(at[1]) : 0.0f;
    }
  }

  // Stage m (phase m % 3 of chunk m / 3): w's lines, then Q's (and the chunk's within, into within
  // buffer chunk % 2), then K's, into line buffer m % STAGES, issued STAGES - 1 stages ahead (a
  // whole chunk ahead with 4 buffers: one phase's products are too short to hide a copy's latency).
  // PHASE is a constant wherever a stage is issued, so that each issue compiles to its own copies.
  // Every stage commits one group of copies, empty past the last chunk, so that async_wait counts them.
  const size_t w_lines = head_at * chunks * CHUNK * DK;                         // this head's w, chunk 0
  const size_t qk_lines = ((size_t)batch * steps * HK + key_head) * DK;         // its key head's q and k, step 0
  const size_t within_lines = head_at * chunks * CHUNK * CHUNK;
#define ISSUE(CHUNK_INDEX, PHASE)                                                                   \
  {                                                                                                 \
    const int stage_chunk = (CHUNK_INDEX), stage_step = stage_chunk * CHUNK;                        \
    THREADGROUP_PTR T* to = stage + ((3 * stage_chunk + (PHASE)) % STAGES) * CHUNK * LDK;           \
    if (stage_chunk >= chunks) {}                                                                   \
    else if ((PHASE) == 0) { COPY_CHUNK(to, w, w + w_lines + (size_t)stage_step * DK, DK, false, stage_step) } \
    else if ((PHASE) == 1) {                                                                        \
      COPY_CHUNK(to, q, q + qk_lines + (size_t)stage_step * HK * DK, HK * DK, true, stage_step)    \
      THREADGROUP_PTR T* within_to = within_tiles + (stage_chunk % 2) * CHUNK * LDW;                \
      const DEVICE T* within_from = within + within_lines + (size_t)stage_chunk * CHUNK * CHUNK;    \
      _Pragma("unroll") for (int pass = 0; pass < (CHUNK * (CHUNK / 8) + THREADS - 1) / THREADS; pass++) { \
        const int i = thread_id + pass * THREADS, r = i / (CHUNK / 8), piece = i % (CHUNK / 8);     \
        if (CHUNK * (CHUNK / 8) % THREADS == 0 || i < CHUNK * (CHUNK / 8))                          \
          async_copy16(within_to + r * LDW + piece * 8, within_from + r * CHUNK + piece * 8, true);  \
      }                                                                                             \
    } else { COPY_CHUNK(to, k, k + qk_lines + (size_t)stage_step * HK * DK, HK * DK, true, stage_step) } \
    async_commit();                                                                                 \
  }
// In phase PHASE of `chunk`: stage 3 * chunk + PHASE + STAGES - 1.
#define ISSUE_AHEAD(PHASE) ISSUE(chunk + ((PHASE) + STAGES - 1) / 3, ((PHASE) + STAGES - 1) % 3)
// This lane's share of a chunk's u (its state rows, its steps' columns: a pair of them per 8-step
// tile) and the cumulative decays of its steps (and the last), read into registers a chunk ahead.
// u stays in T until its use: widened where it is read, the widening waited on the load at once
// (half of the loop's stalls on the H200, by ncu's sampling). Rows past DV read row 0 and count as zeros.
  const DEVICE float* c_lane = c_in + head_at * chunks * CHUNK + frag_col(lane);
  const bool row_real[2] = {my_row[0] < DV, my_row[1] < DV};
  const DEVICE T* u_lane[2] = {u + (head_at * chunks * DV + (row_real[0] ? my_row[0] : 0)) * CHUNK + frag_col(lane),
                               u + (head_at * chunks * DV + (row_real[1] ? my_row[1] : 0)) * CHUNK + frag_col(lane)};
#define READ_AHEAD(CHUNK_INDEX, U_INTO, C_INTO, LAST_INTO)                                          \
  {                                                                                                 \
    const int ahead = min((CHUNK_INDEX), chunks - 1);                                               \
    const DEVICE float* c_at = c_lane + (size_t)ahead * CHUNK;                                      \
    _Pragma("unroll") for (int j = 0; j < STEP_TILES; j++) {                                        \
      C_INTO[j][0] = c_at[j * 8];                                                                   \
      C_INTO[j][1] = c_at[j * 8 + 1];                                                               \
    }                                                                                               \
    LAST_INTO = c_at[CHUNK - 1 - frag_col(lane)];                                                   \
    _Pragma("unroll") for (int h = 0; h < 2; h++) {                                                 \
      const DEVICE T* u_row = u_lane[h] + (size_t)ahead * DV * CHUNK;                               \
      _Pragma("unroll") for (int j = 0; j < STEP_TILES; j++) {                                      \
        U_INTO[j][2 * h] = u_row[j * 8];                                                            \
        U_INTO[j][2 * h + 1] = u_row[j * 8 + 1];                                                    \
      }                                                                                             \
    }                                                                                               \
  }

  DEVICE T* y_lane = y + ((size_t)(batch * steps + frag_col(lane)) * HV + head) * DV;  // this lane's first step's outputs
#pragma unroll
  for (int m = 0; m < STAGES - 1; m++) ISSUE(m / 3, m % 3)
  T next_u[STEP_TILES][4];
  float next_c[STEP_TILES][2], next_last;
  READ_AHEAD(0, next_u, next_c, next_last)
  for (int chunk = 0; chunk < chunks; chunk++) {
    const int first_step = chunk * CHUNK;
    T my_u[STEP_TILES][4];
    float my_c[STEP_TILES][2];
#pragma unroll
    for (int j = 0; j < STEP_TILES; j++) {
#pragma unroll
      for (int e = 0; e < 4; e++) my_u[j][e] = next_u[j][e];
      my_c[j][0] = next_c[j][0];
      my_c[j][1] = next_c[j][1];
    }
    const float c_last = next_last;
    READ_AHEAD(chunk + 1, next_u, next_c, next_last)
    TileA<T> s_a[DK / 16];  // S as the A operand of this chunk's products
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++) tile_a_from_acc(s_a[kk], s[2 * kk], s[2 * kk + 1]);

    // Phase 0: v' = u - S wᵀ.
    async_wait(STAGES - 2);
    threadgroup_barrier();  // w's lines have landed; every SIMD group is done with the last chunk's K
    ISSUE_AHEAD(0)
    const THREADGROUP_PTR T* lines = stage + ((3 * chunk) % STAGES) * CHUNK * LDK;
    TileAcc fresh[STEP_TILES];
    state_times_lines(fresh, s_a, lines, lane);
#pragma unroll
    for (int j = 0; j < STEP_TILES; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) fresh[j].v[e] = (row_real[e / 2] ? to_float(my_u[j][e]) : 0.0f) - fresh[j].v[e];

    // Phase 1: y = (S qᵀ) diag(2^c) + v' withinᵀ.
    async_wait(STAGES - 2);
    threadgroup_barrier();  // Q's lines and within have landed; every SIMD group is done with w
    ISSUE_AHEAD(1)
    lines = stage + ((3 * chunk + 1) % STAGES) * CHUNK * LDK;
    const THREADGROUP_PTR T* within_tile = within_tiles + (chunk % 2) * CHUNK * LDW;
    TileAcc out[STEP_TILES];
    state_times_lines(out, s_a, lines, lane);
#pragma unroll
    for (int j = 0; j < STEP_TILES; j++) {
      const float grow0 = exp2(my_c[j][0]), grow1 = exp2(my_c[j][1]);
      out[j].v[0] *= grow0;
      out[j].v[1] *= grow1;
      out[j].v[2] *= grow0;
      out[j].v[3] *= grow1;
    }
#pragma unroll
    for (int kk = 0; kk < CHUNK / 16; kk++) {
      TileA<T> fresh_a;
      tile_a_from_acc(fresh_a, fresh[2 * kk], fresh[2 * kk + 1]);
#pragma unroll
      for (int j = 0; j < STEP_TILES; j += 2) {
        TileB<T> b0, b1;
        load_tile_b2(b0, b1, within_tile + j * 8 * LDW + kk * 16, LDW, lane);
        tile_mma(out[j], fresh_a, b0);
        tile_mma(out[j + 1], fresh_a, b1);
      }
    }
    DEVICE T* y_chunk = y_lane + (size_t)first_step * HV * DV;
    const bool whole = first_step + CHUNK <= steps;  // every step of the chunk is real: no step to check
#pragma unroll
    for (int h = 0; h < 2; h++) {
      if (!row_real[h]) continue;
#pragma unroll
      for (int j = 0; j < STEP_TILES; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          if (whole || first_step + j * 8 + frag_col(lane) + e < steps)
            from_float(live ? out[j].v[2 * h + e] : 0.0f, y_chunk + (j * 8 + e) * HV * DV + my_row[h]);
        }
      }
    }

    // Phase 2: S = 2^c_last S + (v' diag(2^(c_last - c))) K.
    async_wait(STAGES - 2);
    threadgroup_barrier();  // K's lines have landed; every SIMD group is done with Q and within
    ISSUE_AHEAD(2)
    lines = stage + ((3 * chunk + 2) % STAGES) * CHUNK * LDK;
    const float keep = exp2(c_last);
#pragma unroll
    for (int n = 0; n < S_TILES; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n].v[e] *= keep;
#pragma unroll
    for (int j = 0; j < STEP_TILES; j++) {
      const float fade0 = exp2(c_last - my_c[j][0]), fade1 = exp2(c_last - my_c[j][1]);
      fresh[j].v[0] *= fade0;
      fresh[j].v[1] *= fade1;
      fresh[j].v[2] *= fade0;
      fresh[j].v[3] *= fade1;
    }
#pragma unroll
    for (int kk = 0; kk < CHUNK / 16; kk++) {
      TileA<T> fresh_a;
      tile_a_from_acc(fresh_a, fresh[2 * kk], fresh[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < S_TILES; n += 2) {
        TileB<T> b0, b1;
        load_tile_b2_rows(b0, b1, lines + kk * 16 * LDK + n * 8, LDK, lane);
        tile_mma(s[n], fresh_a, b0);
        tile_mma(s[n + 1], fresh_a, b1);
      }
    }
  }
  async_wait(0);

#pragma unroll
  for (int h = 0; h < 2; h++) {
    if (!live || my_row[h] >= DV) continue;
#if SLOTS
    DEVICE TS* row = pool + (state_at + my_row[h]) * DK + frag_col(lane);
#else
    DEVICE TS* row = state_out + (state_at + my_row[h]) * DK + frag_col(lane);
#endif
#pragma unroll
    for (int n = 0; n < S_TILES; n++) store_pair(s[n].v[2 * h], s[n].v[2 * h + 1], row + n * 8);
  }

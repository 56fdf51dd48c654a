// Prefill attention on the matrix units (the plan's `Tiled` route), FlashAttention-style: tiles of
// query rows against tiles of keys with the online softmax in float32; no score matrix is stored.
//
// A threadgroup serves BQ = WARPS * ROW_TILES * 16 query rows of one key head and one batch item.
// Its rows are the key head's GQA query heads packed with the positions (row R is position R / GQA
// of query head kv_head * GQA + R % GQA), so each K and V tile is loaded once for every query head
// that reads it, and a short chunk of a prompt still fills the tile. Each SIMD group owns ROW_TILES
// tiles of 16 rows. Q is copied once into threadgroup memory; with Q_RESIDENT its fragments then
// stay in registers for the whole key loop (and the buffer takes K and V), otherwise they are read
// from the buffer at every key tile (large heads: the registers hold the output instead).
//
// Key tiles of KEYS keys, aligned to multiples of KEYS from key 0, run from the first tile any of
// the threadgroup's rows sees (a window's start) to the last (causal). K and V have one threadgroup
// buffer each, refilled alternately so that each copy overlaps the other's products (FlashAttention-
// 2's order): V(t) is copied while S = Q K(t)ᵀ and the softmax run, K(t + 1) while O += P V(t).
// Lines of keys outside the threadgroup's range, and the head-size padding (D up to DP, a multiple
// of 16), are zeros in the tiles and are read from nowhere.
//
// Per key tile and SIMD group: S = Q · Kᵀ (16 rows x KEYS keys per row tile), kept as the products
// themselves where the scale is positive (an additive mask added divided by the scale; otherwise
// times scale · log2 e); invisible scores -inf; each row's running maximum m of them, lazily (O and
// the row's sum l move onto a new maximum only when 2^((S - m) · EXP_SCALE) would pass 2^8, as
// FlashAttention-4 does); P = 2^(S · EXP_SCALE - m · EXP_SCALE), one fma and one exp2 an element,
// straight from S's accumulators into the A fragments of O += P · V (rounded to T on CUDA). At the end each row's sum is gathered from the
// four lanes holding it, the sink joins it, and O / l is rounded once. A row that sees no key is
// zeros. Rows past the last (a partial tile) compute on zeros and store nothing.
//
// A row's arithmetic (its key tiles, their order, its maximum's updates) depends on its own position
// and the sizes only: the tiles before its first visible key add exact zeros, so its bits do not
// depend on which rows share its threadgroup, nor on the batch.
//
// Runtime integers (the `ints` buffer, RUNTIME_INTS names them): q_len, k_len (contiguous K/V: their
// offsets in longer caches and strides; paged: max_blocks, pool_blocks), the mask's strides, the
// window. Defines: T, D, DP, DV, HQ, HKV, GQA, WARPS, ROW_TILES, KEYS, Q_RESIDENT, CAUSAL, WINDOW_ON, MASK_KIND
// (0 none, 1 boolean bytes, 2 additive T), SINKS, PAGED, PAGE, SCALE_LOG2E, SCALE_POSITIVE, RUNTIME_INTS.

#define THREADS (WARPS * 32)
#define BQ (WARPS * ROW_TILES * 16)
// Row strides in threadgroup memory: 16 bytes past each line, so that the 8 lines a fragment load
// reads start in 8 different groups of 4 banks.
#define LDK (DP + 8)
#define LDV (DV + 8)
#define Q_ELEMENTS (BQ * LDK)
#define KV_ELEMENTS (KEYS * (LDK + LDV))
#if Q_RESIDENT  // Q's staging, then K's and V's tiles, in one buffer
#define STAGE_ELEMENTS (Q_ELEMENTS > KV_ELEMENTS ? Q_ELEMENTS : KV_ELEMENTS)
#define KV_START 0
#else          // Q, then K's and V's tiles
#define STAGE_ELEMENTS (Q_ELEMENTS + KV_ELEMENTS)
#define KV_START Q_ELEMENTS
#endif
#define K_STEPS (DP / 16)     // mma steps over the features of a score
#define KEY_TILES (KEYS / 8)  // 8-key accumulators of a row tile's scores
#define V_TILES (DV / 8)      // 8-value accumulators of a row tile's output
#if KEYS % 16 != 0 || DP % 16 != 0 || DV % 8 != 0 || D % 8 != 0
#error "sdpa_prefill.h: KEYS and DP must be multiples of 16, D and DV of 8"
#endif

// This thread's share of the copies of KEYS lines, keys FIRST.., into TO (row stride LD): PIECES
// 16-byte pieces a line, of which REAL are read (the rest, the padding, are zeros); lines of keys
// outside [key_lo, key_hi) are zeros. Where the threads divide into whole lines, a thread keeps one
// piece of every THREADS / PIECES-th line (its line's address then grows by a constant).
// Large heads with Q in registers keep the copies' loop rolled: their registers hold Q's fragments
// and the output.
#if DP > 128 && Q_RESIDENT
#define COPY_UNROLL _Pragma("unroll 1")
#else
#define COPY_UNROLL _Pragma("unroll")
#endif
#define COPY_ONE(TO, LD, SOURCE, LINE, REAL, FIRST, line, piece)                                      \
  {                                                                                                 \
    const int key = (FIRST) + (line);                                                               \
    const bool present = key >= key_lo && key < key_hi && (piece) < (REAL);                        \
    async_copy16((TO) + (line) * (LD) + (piece) * 8, present ? (SOURCE) + LINE(key) + (piece) * 8 : (SOURCE), present); \
  }
#define COPY_LINES(TO, LD, SOURCE, LINE, PIECES, REAL, FIRST)                                         \
  if (THREADS % (PIECES) == 0) {                                                                    \
    const int piece = thread_id % (PIECES);                                                         \
    COPY_UNROLL for (int line = thread_id / (PIECES); line < KEYS; line += THREADS / (PIECES))     \
      COPY_ONE(TO, LD, SOURCE, LINE, REAL, FIRST, line, piece)                                      \
  } else {                                                                                          \
    for (int i = thread_id; i < KEYS * (PIECES); i += THREADS) COPY_ONE(TO, LD, SOURCE, LINE, REAL, FIRST, i / (PIECES), i % (PIECES)) \
  }                                                                                                 \
  async_commit();

/* kernel */
  RUNTIME_INTS
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32, warp = thread_id / 32;
  const int kv_head = (int)nv_group.y, batch = (int)nv_group.z;
  THREADGROUP_ROWS

  THREADGROUP uint4 stage_memory[STAGE_ELEMENTS * sizeof(T) / 16];
  THREADGROUP_PTR T* stage = (THREADGROUP_PTR T*)stage_memory;
  THREADGROUP_PTR T* k_tile = stage + KV_START;
  THREADGROUP_PTR T* v_tile = stage + KV_START + KEYS * LDK;

  // Q's rows into threadgroup memory (zeros past the last row and in the padding), then (Q_RESIDENT)
  // each SIMD group's fragments into registers.
  for (int i = thread_id; i < BQ * (DP / 8); i += THREADS) {
    const int r = i / (DP / 8), piece = i % (DP / 8), row = row0 + r;
    const bool present = row < rows_total && piece < D / 8;
    const size_t line = ((size_t)(batch * HQ + kv_head * GQA + row % GQA) * q_len + row / GQA) * D;
    async_copy16(stage + r * LDK + piece * 8, present ? q + line + piece * 8 : q, present);
  }
  async_commit();
  async_wait(0);
  threadgroup_barrier();
  const THREADGROUP_PTR T* q_rows = stage + warp * ROW_TILES * 16 * LDK;  // this SIMD group's
#if Q_RESIDENT
  TileA<T> q_frags[ROW_TILES][K_STEPS];
#pragma unroll
  for (int rt = 0; rt < ROW_TILES; rt++)
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ks++) load_tile_a(q_frags[rt][ks], q_rows + rt * 16 * LDK + ks * 16, LDK, lane);
#endif

  // This lane's rows (frag_row and + 8 of each row tile): position, query head, whether real.
  int row_pos[ROW_TILES][2], row_head[ROW_TILES][2];
  bool row_real[ROW_TILES][2];
  float row_max[ROW_TILES][2], row_sum[ROW_TILES][2];
  TileAcc out_acc[ROW_TILES][V_TILES];
#pragma unroll
  for (int rt = 0; rt < ROW_TILES; rt++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int row = row0 + (warp * ROW_TILES + rt) * 16 + frag_row(lane) + 8 * h;
      row_pos[rt][h] = row / GQA;
      row_head[rt][h] = kv_head * GQA + row % GQA;
      row_real[rt][h] = row < rows_total;
      row_max[rt][h] = -INFINITY;
      row_sum[rt][h] = 0.0f;
    }
#pragma unroll
    for (int nj = 0; nj < V_TILES; nj++) tile_zero(out_acc[rt][nj]);
  }
#if Q_RESIDENT
  threadgroup_barrier();  // every SIMD group has its Q fragments: the buffer takes K and V
#endif

  const int tile_first = key_lo / KEYS, tile_end = (key_hi + KEYS - 1) / KEYS;
  if (tile_first < tile_end) { COPY_LINES(k_tile, LDK, k, K_LINE, DP / 8, D / 8, tile_first * KEYS) }
  for (int tile = tile_first; tile < tile_end; tile++) {
    const int k0 = tile * KEYS;
    // K(tile) has landed; every SIMD group is done with V(tile - 1): V's buffer takes V(tile).
    async_wait(0);
    threadgroup_barrier();
    COPY_LINES(v_tile, LDV, v, V_LINE, DV / 8, DV / 8, k0)

    TileAcc scores[ROW_TILES][KEY_TILES];
#pragma unroll
    for (int rt = 0; rt < ROW_TILES; rt++)
#pragma unroll
      for (int ni = 0; ni < KEY_TILES; ni++) tile_zero(scores[rt][ni]);
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ks++) {
#if Q_RESIDENT
#define Q_FRAG(rt) q_frags[rt][ks]
#else
      TileA<T> q_step[ROW_TILES];
#pragma unroll
      for (int rt = 0; rt < ROW_TILES; rt++) load_tile_a(q_step[rt], q_rows + rt * 16 * LDK + ks * 16, LDK, lane);
#define Q_FRAG(rt) q_step[rt]
#endif
#pragma unroll
      for (int ni = 0; ni < KEY_TILES; ni += 2) {
        TileB<T> key_frag0, key_frag1;
        load_tile_b2(key_frag0, key_frag1, k_tile + ni * 8 * LDK + ks * 16, LDK, lane);
#pragma unroll
        for (int rt = 0; rt < ROW_TILES; rt++) {
          tile_mma(scores[rt][ni], Q_FRAG(rt), key_frag0);
          tile_mma(scores[rt][ni + 1], Q_FRAG(rt), key_frag1);
        }
      }
#undef Q_FRAG
    }

    // Scores in base 2, invisible ones -inf (a tile every row sees whole skips the checks).
    const bool whole = WHOLE_TILE(k0, KEYS);
#pragma unroll
    for (int rt = 0; rt < ROW_TILES; rt++) {
#pragma unroll
      for (int ni = 0; ni < KEY_TILES; ni++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float score = STORED(scores[rt][ni].v[e]);
          if (!whole) {
            const int h = e / 2, key = k0 + ni * 8 + frag_col(lane) + e % 2;
            MASKED_SCORE(score, key, row_pos[rt][h], row_head[rt][h], row_real[rt][h])
          }
          scores[rt][ni].v[e] = score;
        }
      }
    }

    // Each row's maximum over the tile (its four lanes'), then the lazy move onto it.
    float tile_max[ROW_TILES][2];
    bool grows = false;
#pragma unroll
    for (int rt = 0; rt < ROW_TILES; rt++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float best = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < KEY_TILES; ni++) best = max(best, max(scores[rt][ni].v[2 * h], scores[rt][ni].v[2 * h + 1]));
        best = max(best, simd_shuffle_xor(best, ROW_PEER_A));
        best = max(best, simd_shuffle_xor(best, ROW_PEER_B));
        tile_max[rt][h] = best;
        grows = grows || best > row_max[rt][h] + 8.0f / EXP_SCALE;
      }
    }
    if (simd_any(grows)) {
#pragma unroll
      for (int rt = 0; rt < ROW_TILES; rt++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
          if (tile_max[rt][h] > row_max[rt][h] + 8.0f / EXP_SCALE) {
            const float factor = exp2((row_max[rt][h] - tile_max[rt][h]) * EXP_SCALE);  // 0 from -inf: nothing was summed
            row_max[rt][h] = tile_max[rt][h];
            row_sum[rt][h] *= factor;
#pragma unroll
            for (int nj = 0; nj < V_TILES; nj++) {
              out_acc[rt][nj].v[2 * h] *= factor;
              out_acc[rt][nj].v[2 * h + 1] *= factor;
            }
          }
        }
      }
    }
    // The weights, in the scores' place; a row that has seen nothing keeps a maximum of -inf and 0 weights.
#pragma unroll
    for (int rt = 0; rt < ROW_TILES; rt++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const float shift_by = row_max[rt][h] == -INFINITY ? 0.0f : -row_max[rt][h] * EXP_SCALE;
        float sum = 0.0f;
#pragma unroll
        for (int ni = 0; ni < KEY_TILES; ni++) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; e++) {
            const float weight = fast_exp2(fma(scores[rt][ni].v[e], EXP_SCALE, shift_by));
            scores[rt][ni].v[e] = weight;
            sum += weight;
          }
        }
        row_sum[rt][h] += sum;
      }
    }

    // V(tile) has landed; every SIMD group is done with K(tile): K's buffer takes K(tile + 1).
    async_wait(0);
    threadgroup_barrier();
    if (tile + 1 < tile_end) { COPY_LINES(k_tile, LDK, k, K_LINE, DP / 8, D / 8, k0 + KEYS) }

#pragma unroll
    for (int kk = 0; kk < KEYS / 16; kk++) {
      TileA<T> weights[ROW_TILES];
#pragma unroll
      for (int rt = 0; rt < ROW_TILES; rt++) tile_a_from_acc(weights[rt], scores[rt][2 * kk], scores[rt][2 * kk + 1]);
#pragma unroll
      for (int nj = 0; nj + 1 < V_TILES; nj += 2) {
        TileB<T> value_frag0, value_frag1;
        load_tile_b2_rows(value_frag0, value_frag1, v_tile + kk * 16 * LDV + nj * 8, LDV, lane);
#pragma unroll
        for (int rt = 0; rt < ROW_TILES; rt++) {
          tile_mma(out_acc[rt][nj], weights[rt], value_frag0);
          tile_mma(out_acc[rt][nj + 1], weights[rt], value_frag1);
        }
      }
#if V_TILES % 2
      TileB<T> value_frag;
      load_tile_b_rows(value_frag, v_tile + kk * 16 * LDV + (V_TILES - 1) * 8, LDV, lane);
#pragma unroll
      for (int rt = 0; rt < ROW_TILES; rt++) tile_mma(out_acc[rt][V_TILES - 1], weights[rt], value_frag);
#endif
    }
  }
  async_wait(0);  // nothing is in flight past the loop

  // Each row's sum from its four lanes, the sink, then O / l rounded once.
#pragma unroll
  for (int rt = 0; rt < ROW_TILES; rt++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float sum = row_sum[rt][h];
      sum += simd_shuffle_xor(sum, ROW_PEER_A);
      sum += simd_shuffle_xor(sum, ROW_PEER_B);
      if (!row_real[rt][h]) continue;
      const float inverse = ROW_INVERSE(sum, row_max[rt][h], row_head[rt][h]);
      DEVICE T* out_row = out + ((size_t)(batch * HQ + row_head[rt][h]) * q_len + row_pos[rt][h]) * DV + frag_col(lane);
#pragma unroll
      for (int nj = 0; nj < V_TILES; nj++)
        store_pair(out_acc[rt][nj].v[2 * h] * inverse, out_acc[rt][nj].v[2 * h + 1] * inverse, out_row + nj * 8);
    }
  }

// Decode attention on the matrix units: the first pass, for 16-bit K/V (CUDA mma.sync m16n8k16).
// CUDA only: its fragments are the mma's; Metal keeps the vector pass (MLX's decode uses no
// simdgroup matrices either; docs/design.md, "Decisions and open questions", says what a Metal
// version would take).
//
// A threadgroup serves one key head, 16 of its query rows (rows `g * LQ + l` over the GQA query
// heads `g` and positions `l`; rows past the head's GQA * LQ are zeros and write nothing), one
// batch item and `blocks_per_group` of the BLOCKS key blocks, in turn (a runtime integer: a large
// batch takes fewer, longer threadgroups, and a block's partial is the same whichever threadgroup
// computes it). Its NUM_WARPS SIMD groups take turns over a block's 16-key tiles; their partial
// results merge through threadgroup memory into the block's partial for the merge pass.
//
// Per tile, in the fragments of mma m16n8k16 (lane = 4 * g + c; A is 16 x 16 and B 16 x 8, C
// 16 x 8; a lane holds A's rows g and g + 8, B's column g and C's columns 2c, 2c + 1):
// - Scores S [rows, keys] = Q [rows, D] · K^T [D, keys], two mma tiles of 8 keys. B = K^T, so a
//   lane holds one key line's features: it reads its key's 16-byte pieces 4j + c straight from
//   memory. The sum over features is order-free, so the k index of each mma step is mapped onto
//   those pieces (Q's A fragments, loaded once, use the same mapping).
// - The online softmax on S's C fragments: a lane holds rows g and g + 8 at keys 2c, 2c + 1 of
//   each 8-key half, so a row's maximum over the tile is two shuffles. Scores are in base 2 (the
//   products scaled by scale · log2 e in float32); the rescale is lazy (a row's maximum must grow
//   by more than 2^8) and SIMD-group-uniform.
// - O [rows, DV] += P [rows, 16 keys] · V [16 keys, DV]: S's C fragments are P's A fragment as
//   they stand (rounded to T); V's B fragment needs two keys' values of one column in a word, so
//   a lane reads four value lines' 16-byte pieces (keys 2c, 2c + 1, 8 + 2c, 9 + 2c; piece
//   8 * i + g) and pairs their halves with byte permutes. The n index of each of the DV / 8 output
//   tiles is mapped onto those pieces (tile 8 * i + e, column n: value 8 * (8 * i + n) + e).
//
// Defines: T, MMA (mma_bf16 or mma_f16), D, DV, HQ, HKV, GQA, LQ, ROW_GROUPS, NUM_WARPS, BLOCKS, PREFETCH, L2_AHEAD,
// CAUSAL, WINDOW_ON, MASK_KIND (0 none, 1 bool, 2 additive), PAGED, PAGE, SCALE_LOG2E, K_LEN,
// RUNTIME_INTS (with `blocks_per_group`). D is a multiple of 32 and DV of 64.

#define K_PIECES (D / 32)   // 16-byte pieces of a key line per lane
// Where value `col` of staged row `slot` sits in threadgroup memory: the columns of a row XORed
// within their 16 by the row and by bit 5 of the column, so that a SIMD group's store of one
// output fragment (8 rows x 4 columns 16 apart) hits 32 different banks (unswizzled, 2: a 16-way
// conflict), while a row's 32 consecutive columns stay a permutation of 32 banks for the merge.
// The rows a threadgroup stages (its real rows), and its staging buffers: two where they fit in
// 44 KB (of the 48 KB a threadgroup may declare; at DV 128: 4 SIMD groups of 8 rows or fewer, 8 of
// 4 or fewer), so that no SIMD group waits for the others at a block's end (the block loop's
// epilogue says how); with one, a block's merge sits between two barriers.
#define STAGED_ROWS (GQA * LQ < 16 ? GQA * LQ : 16)
#define STAGE_BUFFERS (2 * NUM_WARPS * STAGED_ROWS * (DV + 2) * 4 <= 44 * 1024 ? 2 : 1)
#define STAGED(slot, col) ((slot) * DV + ((col) ^ ((2 * ((slot) & 7)) | (((col) >> 5) & 1))))
#define V_PIECES (DV / 64)  // 16-byte pieces of a value line per lane
#define K_STEPS (D / 16)    // mma steps of the scores
#define V_TILES (DV / 8)    // mma tiles of the output

#if PAGED
INLINE int line_start(const DEVICE int* block_tables, int batch, int max_blocks, int pool_blocks, int kv_head, int key, int width) {
  const int page = min(max(block_tables[batch * max_blocks + key / PAGE], 0), pool_blocks - 1);
  return ((page * HKV + kv_head) * PAGE + key % PAGE) * width;
}
#define K_LINE(key) line_start(block_tables, batch, max_blocks, pool_blocks, kv_head, key, D)
#define V_LINE(key) line_start(block_tables, batch, max_blocks, pool_blocks, kv_head, key, DV)
#else
#define K_LINE(key) (batch * k_batch_stride + kv_head * k_head_stride + (k_offset + (key)) * D)
#define V_LINE(key) (batch * v_batch_stride + kv_head * v_head_stride + (v_offset + (key)) * DV)
#endif

// Loads lane's pieces of the 16-key tile at key FIRST: its key line (8h + g) for the scores and
// its four value lines (8 * (l / 2) + 2c + l % 2) into K_PIECE and V_PIECE; lines at or past
// END (the block's end) are zeros, so they bring no NaN or infinity into the products.
#define LOAD_TILE(FIRST, END, K_PIECE, V_PIECE)                                                       \
  _Pragma("unroll") for (int h = 0; h < 2; h++) {                                              \
    const int key = (FIRST) + 8 * h + g;                                                       \
    if (key < (END)) {                                                                       \
      const DEVICE uint4* k_line = (const DEVICE uint4*)(k + K_LINE(key));                     \
      _Pragma("unroll") for (int j = 0; j < K_PIECES; j++) K_PIECE[h][j] = k_line[4 * j + c];  \
    } else {                                                                                   \
      _Pragma("unroll") for (int j = 0; j < K_PIECES; j++) K_PIECE[h][j] = uint4{0u, 0u, 0u, 0u}; \
    }                                                                                          \
  }                                                                                            \
  _Pragma("unroll") for (int l = 0; l < 4; l++) {                                              \
    const int key = (FIRST) + 8 * (l / 2) + 2 * c + l % 2;                                     \
    if (key < (END)) {                                                                       \
      const DEVICE uint4* v_line = (const DEVICE uint4*)(v + V_LINE(key));                     \
      _Pragma("unroll") for (int i = 0; i < V_PIECES; i++) V_PIECE[l][i] = v_line[8 * i + g];  \
    } else {                                                                                   \
      _Pragma("unroll") for (int i = 0; i < V_PIECES; i++) V_PIECE[l][i] = uint4{0u, 0u, 0u, 0u}; \
    }                                                                                          \
  }

/* kernel */
  RUNTIME_INTS
  const int lane = (int)nv_thread.x % 32, warp = (int)nv_thread.x / 32;
  const int g = lane / 4, c = lane % 4;
  const int kv_head = (int)nv_group.x / ROW_GROUPS, first_row = ((int)nv_group.x % ROW_GROUPS) * 16;
  const int batch = (int)nv_group.y;
  const int k_len = SEQUENCE_KEYS, range_start = FIRST_VISIBLE_KEY(k_len);
  const int per_block = KEYS_PER_BLOCK(k_len, range_start);

  // This lane's two rows (g and g + 8): whether they exist, their query head and position.
  bool row_real[2];
  int row_head[2], row_position[2];
  uint q_frag[K_STEPS][4];
#pragma unroll
  for (int half_rows = 0; half_rows < 2; half_rows++) {
    const int row = first_row + g + 8 * half_rows;
    row_real[half_rows] = row < GQA * LQ;
    row_head[half_rows] = kv_head * GQA + row / LQ;
    row_position[half_rows] = row % LQ;
    const DEVICE uint4* q_line = (const DEVICE uint4*)(q + ((batch * HQ + row_head[half_rows]) * LQ + row_position[half_rows]) * D);
#pragma unroll
    for (int j = 0; j < K_PIECES; j++) {
      uint4 piece = uint4{0u, 0u, 0u, 0u};
      if (row_real[half_rows]) piece = q_line[4 * j + c];
      q_frag[2 * j][half_rows] = piece.x;
      q_frag[2 * j][2 + half_rows] = piece.y;
      q_frag[2 * j + 1][half_rows] = piece.z;
      q_frag[2 * j + 1][2 + half_rows] = piece.w;
    }
  }

  THREADGROUP float shared_acc[STAGE_BUFFERS * NUM_WARPS * STAGED_ROWS * DV];
  THREADGROUP float shared_max[STAGE_BUFFERS * NUM_WARPS * STAGED_ROWS], shared_sum[STAGE_BUFFERS * NUM_WARPS * STAGED_ROWS];
  const int first_block = (int)nv_group.z * blocks_per_group, block_stop = min(BLOCKS, first_block + blocks_per_group);
  // This SIMD group's share of block `block`'s merge: rows warp, warp + NUM_WARPS, ... of the SIMD
  // groups' staged partials in `buffer`, merged in SIMD-group order into the block's partial. A
  // row's merge factors are computed once (a lane per column after that: 32 consecutive columns
  // are 32 banks, and the stores are whole lines); which SIMD group merges a row does not change
  // its arithmetic.
  const int rows_here = min(16, GQA * LQ - first_row);
  auto merge_block = [&](int block, int buffer) {
    const THREADGROUP_PTR float* staged_acc = shared_acc + buffer * NUM_WARPS * STAGED_ROWS * DV;
    const THREADGROUP_PTR float* staged_max = shared_max + buffer * NUM_WARPS * STAGED_ROWS;
    const THREADGROUP_PTR float* staged_sum = shared_sum + buffer * NUM_WARPS * STAGED_ROWS;
    for (int r = warp; r < rows_here; r += NUM_WARPS) {
      const int row = first_row + r, out_row = (batch * HQ + kv_head * GQA + row / LQ) * LQ + row % LQ;
      float merged = -INFINITY, factor[NUM_WARPS];
#pragma unroll
      for (int w = 0; w < NUM_WARPS; w++) merged = max(merged, staged_max[w * STAGED_ROWS + r]);
#pragma unroll
      for (int w = 0; w < NUM_WARPS; w++) factor[w] = merge_factor(staged_max[w * STAGED_ROWS + r], merged);
      for (int e = lane; e < DV; e += 32) {
        float value = 0.0f;
#pragma unroll
        for (int w = 0; w < NUM_WARPS; w++) value += staged_acc[STAGED(w * STAGED_ROWS + r, e)] * factor[w];
        part_acc[(out_row * BLOCKS + block) * DV + e] = value;
      }
      if (lane == 0) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < NUM_WARPS; w++) total += staged_sum[w * STAGED_ROWS + r] * factor[w];
        part_max[out_row * BLOCKS + block] = merged;
        part_sum[out_row * BLOCKS + block] = total;
      }
    }
  };
#if STAGE_BUFFERS == 2
  // A staging barrier per buffer, which every thread arrives at once it has staged a block there:
  // buffer b's n-th block (n from 0) is staged when the barrier's phase n has completed.
  THREADGROUP unsigned long long staged[2];
  if ((int)nv_thread.x < 2) stage_barrier_init(&staged[nv_thread.x], 32 * NUM_WARPS);
  threadgroup_barrier();
#endif
  uint4 k_next[2][K_PIECES], v_next[4][V_PIECES];
  int loaded = -1;  // the block whose first tile k_next and v_next hold (PREFETCH)
#if L2_AHEAD
  // Deeper than the registers' tile in flight: each SIMD group asks L2 for its own tile L2_AHEAD
  // rounds ahead (lanes 0-15 a key line each, 16-31 a value line), which costs no register. A
  // block's keys are whole rounds, so round r ahead is the SIMD group's tile there even in the
  // next block. The first rounds are asked for here.
  const int keys_stop = min(k_len, range_start + block_stop * per_block);
  auto prefetch_tile = [&](int first) {
    const int key = first + lane % 16;
    if (key >= keys_stop) return;
    if (lane < 16) prefetch_l2(k + K_LINE(key), D * (int)sizeof(T));
    else prefetch_l2(v + V_LINE(key), DV * (int)sizeof(T));
  };
  for (int round = 1; round < L2_AHEAD; round++) prefetch_tile(range_start + first_block * per_block + 16 * (warp + NUM_WARPS * round));
#endif
  for (int block = first_block; block < block_stop; block++) {
    const int key_begin = range_start + block * per_block;
    const int key_end = min(k_len, key_begin + per_block);
    float out_frag[V_TILES][4];
#pragma unroll
    for (int t = 0; t < V_TILES; t++) out_frag[t][0] = out_frag[t][1] = out_frag[t][2] = out_frag[t][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    // The bound is the same for the whole SIMD group (the mma needs every lane). With PREFETCH a
    // lane loads the next tile, or the next block's first, before it uses this one (registers for
    // two tiles in flight).
    if (loaded != block) LOAD_TILE(key_begin + 16 * warp, key_end, k_next, v_next)
    for (int first = key_begin + 16 * warp; first < key_end; first += 16 * NUM_WARPS) {
#if L2_AHEAD
      prefetch_tile(first + 16 * NUM_WARPS * L2_AHEAD);
#endif
#if PREFETCH
      uint4 k_piece[2][K_PIECES], v_piece[4][V_PIECES];
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int j = 0; j < K_PIECES; j++) k_piece[h][j] = k_next[h][j];
#pragma unroll
      for (int l = 0; l < 4; l++)
#pragma unroll
        for (int i = 0; i < V_PIECES; i++) v_piece[l][i] = v_next[l][i];
      if (first + 16 * NUM_WARPS < key_end) {
        LOAD_TILE(first + 16 * NUM_WARPS, key_end, k_next, v_next)
      } else if (block + 1 < block_stop) {
        const int next_begin = key_begin + per_block;
        LOAD_TILE(next_begin + 16 * warp, min(k_len, next_begin + per_block), k_next, v_next)
        loaded = block + 1;
      }
#else
      if (first != key_begin + 16 * warp) LOAD_TILE(first, key_end, k_next, v_next)
      uint4 (&k_piece)[2][K_PIECES] = k_next;
      uint4 (&v_piece)[4][V_PIECES] = v_next;
#endif

      // Scores: score[h][e] is row g (e < 2) or g + 8, key first + 8h + 2c + e % 2.
      float score[2][4];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        score[h][0] = score[h][1] = score[h][2] = score[h][3] = 0.0f;
#pragma unroll
        for (int j = 0; j < K_PIECES; j++) {
          MMA(score[h], q_frag[2 * j], k_piece[h][j].x, k_piece[h][j].y);
          MMA(score[h], q_frag[2 * j + 1], k_piece[h][j].z, k_piece[h][j].w);
        }
      }
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = e / 2, key = first + 8 * h + 2 * c + e % 2;
          bool visible = row_real[r] && key < key_end;
#if CAUSAL || PAGED
          visible = visible && key <= k_len - LQ + row_position[r];
#endif
#if WINDOW_ON
          visible = visible && key > k_len - LQ + row_position[r] - window;
#endif
          float value = score[h][e] * SCALE_LOG2E;
#if MASK_KIND
          if (visible) {
            const int mask_index = batch * mask_batch_stride + row_head[r] * mask_head_stride + row_position[r] * mask_query_stride +
                                   key * mask_key_stride;
#if MASK_KIND == 1
            visible = mask[mask_index] != 0;
#else
            value += to_float(mask[mask_index]) * LOG2E;
#endif
          }
#endif
          score[h][e] = visible ? value : -INFINITY;
          tile_max[r] = max(tile_max[r], score[h][e]);
        }
      }

      // The online softmax (lazy rescale), then P in T: P's A fragment is S's C fragments.
      float correction[2] = {1.0f, 1.0f};
#pragma unroll
      for (int r = 0; r < 2; r++) {
        tile_max[r] = max(tile_max[r], simd_shuffle_xor(tile_max[r], 1));
        tile_max[r] = max(tile_max[r], simd_shuffle_xor(tile_max[r], 2));
        if (tile_max[r] > row_max[r] + 8.0f) {
          correction[r] = fast_exp2(row_max[r] - tile_max[r]);
          row_sum[r] *= correction[r];
          row_max[r] = tile_max[r];
        }
      }
      if (simd_any(correction[0] != 1.0f || correction[1] != 1.0f)) {  // rare: the whole SIMD group branches
#pragma unroll
        for (int t = 0; t < V_TILES; t++) {
          out_frag[t][0] *= correction[0];
          out_frag[t][1] *= correction[0];
          out_frag[t][2] *= correction[1];
          out_frag[t][3] *= correction[1];
        }
      }
      uint p_frag[4];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float weight[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          weight[e] = score[h][e] == -INFINITY ? 0.0f : fast_exp2(score[h][e] - row_max[e / 2]);
          row_sum[e / 2] += weight[e];
        }
        p_frag[2 * h] = pack_pair(weight[0], weight[1], (T)0);      // row g, keys 8h + 2c, +1
        p_frag[2 * h + 1] = pack_pair(weight[2], weight[3], (T)0);  // row g + 8
      }

      // O += P · V: tile 8i + e of the output, column n (this lane's B column: n = g) is value
      // 8 * (8i + g) + e, the e-th half of this lane's piece i of each value line.
#pragma unroll
      for (int i = 0; i < V_PIECES; i++) {
        const uint* line_a = (const uint*)&v_piece[0][i];
        const uint* line_b = (const uint*)&v_piece[1][i];
        const uint* line_c = (const uint*)&v_piece[2][i];
        const uint* line_d = (const uint*)&v_piece[3][i];
#pragma unroll
        for (int w = 0; w < 4; w++) {
          MMA(out_frag[8 * i + 2 * w], p_frag, low_halves(line_a[w], line_b[w]), low_halves(line_c[w], line_d[w]));
          MMA(out_frag[8 * i + 2 * w + 1], p_frag, high_halves(line_a[w], line_b[w]), high_halves(line_c[w], line_d[w]));
        }
      }
    }

    // The SIMD groups' partials through threadgroup memory (a row's weight sum over its four lanes
    // first; C's element (row, 2c + j) of tile 8i + e is value 8 * (8i + 2c + j) + e, at STAGED;
    // rows past the head's are not written), merged by `merge_block`.
    // Two buffers: no SIMD group waits for the others at a block's end. It merges its share of the
    // previous block once every SIMD group has staged that one (by then, almost always), then
    // stages this one and arrives at its barrier. A buffer is reused two blocks later, when every
    // SIMD group has arrived at the block between's, so has merged its share of this one.
    // One buffer: stage, barrier, merge, barrier.
    const int position = block - first_block, buffer = STAGE_BUFFERS == 2 ? position % 2 : 0;
#if STAGE_BUFFERS == 2
    if (position > 0) {
      stage_wait(&staged[1 - buffer], (position - 1) / 2 % 2);
      merge_block(block - 1, 1 - buffer);
    }
#endif
    THREADGROUP_PTR float* staged_acc = shared_acc + buffer * NUM_WARPS * STAGED_ROWS * DV;
    THREADGROUP_PTR float* staged_max = shared_max + buffer * NUM_WARPS * STAGED_ROWS;
    THREADGROUP_PTR float* staged_sum = shared_sum + buffer * NUM_WARPS * STAGED_ROWS;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      row_sum[r] += simd_shuffle_xor(row_sum[r], 1);
      row_sum[r] += simd_shuffle_xor(row_sum[r], 2);
      if (!row_real[r]) continue;
      const int slot = warp * STAGED_ROWS + g + 8 * r;
      if (c == 0) {
        staged_max[slot] = row_max[r];
        staged_sum[slot] = row_sum[r];
      }
#pragma unroll
      for (int i = 0; i < V_PIECES; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
          for (int e = 0; e < 8; e++) staged_acc[STAGED(slot, 8 * (8 * i + 2 * c + j) + e)] = out_frag[8 * i + e][2 * r + j];
    }
#if STAGE_BUFFERS == 2
    stage_arrive(&staged[buffer]);
#else
    threadgroup_barrier();
    merge_block(block, 0);
    threadgroup_barrier();  // read before the next block writes it
#endif
  }
#if STAGE_BUFFERS == 2
  if (block_stop > first_block) {  // the last block's merge
    const int last = block_stop - 1 - first_block;
    stage_wait(&staged[last % 2], last / 2 % 2);
    merge_block(block_stop - 1, last % 2);
  }
#endif

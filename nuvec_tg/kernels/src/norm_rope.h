// RMS norm and rotary embedding in one pass, written where the rows belong (`norm_rope`,
// `norm_rope_at` and `norm_rope_kv` in fast/rope.py): each row of x is read once and its result
// written once, into fresh outputs, a cache at the row's position or a paged pool's slot. ROWS
// rows a threadgroup, LANES threads a row.
//
// A row is read as norm.h reads it, with the norm kernel's launch for the row's length (pieces of
// VEC elements, PER a thread): lane l of the row holds pieces l, l + LANES, ... in registers, so
// that its sum of squares has that kernel's bits. Each lane sums its squares in order; a row of
// more than 32 lanes (one a threadgroup) is then summed by GROUP_SUM, as norm.h sums it; in a
// SIMD group of 32 / LANES rows each row's lane sums in turn are moved to lanes 0..LANES-1, zeros
// above, and summed by simd_sum: what norm.h's one SIMD group sums for such a row.
//   NORM:   y = TO(TO(x * r) * w), r = 1 / sqrt(sum / length + EPS) (norm.h's); else y = x (TO = TX)
//   VALUES 1: v = TX(x * (1 / sqrt(sum / length + V_EPS))) (rms_norm without a weight), stored as TV
//           from the registers
//   VALUES 2: v = the same row of `v_rows` (TVI, a layout of its own), copied as TV beside it (a
//           model's values written into the cache or pool by the keys' kernel)
// y goes to threadgroup memory in TO, the type rope.h reads it in; then the row's units (rope.h's:
// UNIT pairs, or a piece past dims) turn it as rotation.h says, rounded to TO, then stored as TK.
//
// Where row r = (b, ..., t) of x [B, ..., T, length] goes (DEST), its rotated row and its values alike:
//   0  row r of fresh outputs of x's shape
//   1  a cache [B * H, S, length]: row r / T at position offsets[0] + t (not wrapped), skipped
//      outside 0..S-1
//   2  a pool [blocks, H, block_size, length] (x [B, H, T, length]): slot s = slots[b * T + t] is
//      row s % block_size of head (r / T) % H in block s / block_size, skipped outside
//      0..blocks * block_size - 1. Rows naming one slot race: the slot's pieces come from either.
// QUERIES 1 (a model's queries beside its keys, `queries=` of norm_rope and norm_rope_at): the
// first ceil(q_rows / ROWS) threadgroups take the rows of q_x [B, Hq, T, length] instead, each
// normalised with q_weight (NORM; the keys' eps) and turned at its batch item's and step's
// position as a key row is, into row r of fresh outputs `queries` (TQ); no values. A query row
// runs the arithmetic of a key row, so its bits are those of norm_rope over q alone (DEST 0).
// A skipped row is not read. Every read lies in x's and v_rows' rows (as the strides place them),
// the weight, the `pairs` inverse frequencies, offsets[0] or offsets[b], and slots[b * T + t], for
// rows r < rows; every write in its destination row. No row's arithmetic depends on another's, nor on ROWS: a row's bits never
// depend on the batch.
//
// Defines: TX (x's and q_x's type), TO (the normalised rows'), TK, TQ (QUERIES), TV (the destinations' types: rotated rows,
// values), TVI (v_rows'; VALUES 2), TW (the weight's; NORM), NORM, VALUES, DEST, TRADITIONAL, SCALE, EPS (NORM), V_EPS
// (VALUES), VEC, PER (norm.h's pieces), LANES, ROWS, THREADS (LANES * ROWS), HELD (elements a row
// keeps in threadgroup memory: LANES * PER * VEC), UNIT (pairs a rotating unit turns: it divides
// pairs and length), QUERIES; CHUNK_<buffer> and <buffer>_CHUNKS, how a piece is read or written
// (X, W, V and VI by VEC elements, K and Q by UNIT).
// Runtime integers (`ints`): the row length, pairs (dims / 2), T, rows per batch item, rows,
// per_batch (offsets has B elements, else one), places (S, or blocks * block_size), heads (H of a
// pool), block_size; then where x's rows lie in its buffer: its heads (rows per batch item / T),
// the first element, and the batch item's, head's and step's element strides (row r = (b, head,
// t) starts at first + b * batch + head * head stride + t * step; every one a multiple of VEC, the
// row's elements consecutive; a contiguous x: 0, H * T * length, T * length, length); with
// VALUES 2 the same five for v_rows (ints[14..18], zeros otherwise where QUERIES follow); with
// QUERIES the query rows (ints[19]), their rows per batch item (ints[20]) and q_x's five (ints[21..25]).

/* kernel */
  const int length = ints[0], pairs = ints[1], steps = ints[2];
  const int per_batch = ints[5], places = ints[6];
  const int me = (int)nv_thread.x, lane = me % 32, warp = me / 32;  // not "thread": a Metal keyword
  const int mine = me / LANES, part = me % LANES;  // this thread's row of the threadgroup, and lane in it
#if QUERIES
  const int query_groups = (ints[19] + ROWS - 1) / ROWS;
  const bool query = (int)nv_group.x < query_groups;  // this threadgroup's rows: q_x's, else x's
  const int group = query ? (int)nv_group.x : (int)nv_group.x - query_groups;
  const int rows = query ? ints[19] : ints[4], batch_rows = query ? ints[20] : ints[3];
  const int layout = query ? 21 : 9;  // where the rows' layout starts in ints
  const DEVICE TX* const source = query ? q_x : x;
#else
  const bool query = false;
  const int group = (int)nv_group.x, rows = ints[4], batch_rows = ints[3], layout = 9;
  const DEVICE TX* const source = x;
#endif
  const int row = group * ROWS + mine;
  const int pieces = length / VEC;
  const int b = row / batch_rows, t = row % steps;
  // the row r = (b, head, t) in place in its buffer (a head of a projection's output, say)
  const long base = (long)ints[layout + 1] + (long)b * ints[layout + 2] + (long)((row / steps) % ints[layout]) * ints[layout + 3] +
                    (long)t * ints[layout + 4];
#if VALUES == 2
  const long v_base = (long)ints[15] + (long)b * ints[16] + (long)((row / steps) % ints[14]) * ints[17] + (long)t * ints[18];
#endif
  THREADGROUP TO kept[ROWS * HELD];  // each row's y, where the rotating units read it
#if LANES > 32
  THREADGROUP float partial[THREADS / 32];
#endif

  // The destination row, or -1: a row past the last, or one outside the cache or pool. Every
  // thread stays until the barrier: the SIMD sums and the barrier need them all.
  long dest = -1;
  if (row < rows && !query) {
#if DEST == 0
    dest = row;
#elif DEST == 1
    const long position = (long)offsets[0] + t;
    if (position >= 0 && position < places) dest = (long)(row / steps) * places + position;
#else
    const int heads = ints[7], block_size = ints[8];
    const int slot = slots[b * steps + t];
    if (slot >= 0 && slot < places)
      dest = ((long)(slot / block_size) * heads + (row / steps) % heads) * block_size + slot % block_size;
#endif
  }
  if (row < rows && query) dest = row;  // a query's row: row r of the fresh outputs

  float held[PER][VEC];  // this thread's pieces, zero past the row
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int p = part + k * LANES;
    if (dest >= 0 && p < pieces) {
      LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, source + base + (long)p * VEC, held[k])
#pragma unroll
      for (int e = 0; e < VEC; e++) { const float value = held[k][e]; sum += value * value; }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; e++) held[k][e] = 0.0f;
    }
  }

#if NORM || VALUES == 1
  float squares;
#if LANES > 32
  GROUP_SUM(sum, squares)
#else
  squares = 0.0f;
#pragma unroll
  for (int r = 0; r < 32 / LANES; r++) {
    const float moved = simd_shuffle(sum, r * LANES + lane % LANES);
    const float total = simd_sum(lane < LANES ? moved : 0.0f);
    if (lane / LANES == r) squares = total;
  }
#endif
#endif
#if NORM
  const float scale = 1.0f / sqrt(squares / (float)length + EPS);  // correctly rounded, as norm.h's
#if QUERIES
  const DEVICE TW* const weights = query ? q_weight : weight;
#else
  const DEVICE TW* const weights = weight;
#endif
#endif
#if VALUES == 1
  const float value_scale = 1.0f / sqrt(squares / (float)length + V_EPS);
#endif

#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int p = part + k * LANES;
    if (dest < 0 || p >= pieces) continue;
    float y[VEC];
#if NORM
    float weight_[VEC];
    LOAD_PIECE(CHUNK_W, W_CHUNKS, TW, weights + p * VEC, weight_)
#pragma unroll
    for (int e = 0; e < VEC; e++) y[e] = to_float(TO(to_float(TO(held[k][e] * scale)) * weight_[e]));
#else
#pragma unroll
    for (int e = 0; e < VEC; e++) y[e] = held[k][e];
#endif
#pragma unroll
    for (int e = 0; e < VEC; e++) kept[mine * HELD + p * VEC + e] = TO(y[e]);
    if (query) continue;  // no values
#if VALUES == 1
    float v[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) v[e] = to_float(TX(held[k][e] * value_scale));
    STORE_PIECE(CHUNK_V, V_CHUNKS, TV, v, values + dest * length + (long)p * VEC)
#elif VALUES == 2
    float v[VEC];
    LOAD_PIECE(CHUNK_VI, VI_CHUNKS, TVI, v_rows + v_base + (long)p * VEC, v)
    STORE_PIECE(CHUNK_V, V_CHUNKS, TV, v, values + dest * length + (long)p * VEC)
#endif
  }
  threadgroup_barrier();
  if (dest < 0) return;  // nothing below waits for another thread

  const float scaled = scaled_position(offsets, per_batch, b, t);
  const int rotating = pairs / UNIT, units = rotating + (length - 2 * pairs) / UNIT;
  const int at_row = mine * HELD;
  DEVICE TK* const into = rotated + (query ? 0 : dest * length);
#if QUERIES
  DEVICE TQ* const q_into = queries + (query ? dest * length : 0);
#define STORE_ROTATED(from, at)                                                                     \
  if (query) STORE_PIECE(CHUNK_Q, Q_CHUNKS, TQ, from, q_into + (at))                                \
  else STORE_PIECE(CHUNK_K, K_CHUNKS, TK, from, into + (at))
#else
#define STORE_ROTATED(from, at) STORE_PIECE(CHUNK_K, K_CHUNKS, TK, from, into + (at))
#endif
  for (int u = part; u < units; u += LANES) {
    float v[2 * UNIT], out[2 * UNIT];
    if (u >= rotating) {  // a piece past dims, as it is
      const int at = 2 * pairs + (u - rotating) * UNIT;
#pragma unroll
      for (int e = 0; e < UNIT; e++) out[e] = to_float(kept[at_row + at + e]);
      STORE_ROTATED(out, at)
      continue;
    }
    const int first = UNIT_FIRST(UNIT, u), second = first + UNIT_GAP(UNIT, pairs);
#pragma unroll
    for (int e = 0; e < UNIT; e++) {
      v[e] = to_float(kept[at_row + first + e]);
      v[UNIT + e] = to_float(kept[at_row + second + e]);
    }
    ROTATE_UNIT(UNIT, v, inv_freq + u * UNIT, scaled, out)
#pragma unroll
    for (int e = 0; e < 2 * UNIT; e++) out[e] = to_float(TO(out[e]));  // rope's rounding, then the destination's
    STORE_ROTATED(out, first)
    STORE_ROTATED(out + UNIT, second)
  }

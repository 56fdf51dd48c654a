// The gated delta rule, a SIMD group per ROWS value rows of a head's state.
//
// A SIMD group serves ROWS consecutive rows of the `[DV, DK]` state of value head `head` (key head
// `head / (HV / HK)`) of batch item `batch`: lane `l` keeps each row's EK = DK / 32 consecutive
// entries `l * EK ...` in float32 registers for the whole time loop, so the state is read once and
// written once per call, each lane's share (and its share of k and q) in the widest aligned
// pieces (CHUNK_x, x_CHUNKS of them: 16-byte `uint4` for a float32 row of 128). Per step:
//
//     s *= g;  remembered = sum(s * k);  s += k * beta * (v[row] - remembered);  y[row] = sum(s * q)
//
// with the sums by SIMD reductions. Variants: the final state (STATE_OUT), every step's state
// rounded to the storage type and continued from the rounded value (STEPS_OUT), or a pool read
// and written in place at `slots[batch]` (SLOTS; a slot outside the pool reads zeros, writes
// nothing and gives zero outputs).
//
// Defines: TQ, TK, TV, TG, TB (the types of q, k, v, g and beta), TS (state or pool), TO (steps' storage), DK, DV,
// HK, HV, EK, WARPS, ROWS (rows per SIMD group), STATE_OUT, STEPS_OUT, SLOTS, ROUND_STORAGE(x) (x rounded to TO, as float),
// CHUNK_S/S_CHUNKS (a lane's share of a TS row), CHUNK_O/O_CHUNKS (of a TO row), CHUNK_K/K_CHUNKS,
// CHUNK_Q/Q_CHUNKS (of a key and a query).
// Runtime integers (`ints`): the steps, and the pool's slots (SLOTS).

// A lane's EK consecutive values of a row starting at `from`, read in CHUNK pieces, as float32.
#define LOAD_SHARE(CHUNK, COUNT, T, from, into)                                                 \
  {                                                                                            \
    CHUNK raw_[COUNT];                                                                         \
    _Pragma("unroll") for (int c = 0; c < COUNT; c++) raw_[c] = ((const DEVICE CHUNK*)(from))[c]; \
    const THREAD T* values_ = (const THREAD T*)raw_;                                           \
    _Pragma("unroll") for (int e = 0; e < EK; e++) into[e] = to_float(values_[e]);             \
  }
// The same, written: `from` (float32) converted to T and stored at `to` in CHUNK pieces.
#define STORE_SHARE(CHUNK, COUNT, T, from, to)                                                  \
  {                                                                                            \
    CHUNK raw_[COUNT];                                                                         \
    THREAD T* values_ = (THREAD T*)raw_;                                                       \
    _Pragma("unroll") for (int e = 0; e < EK; e++) values_[e] = T(from[e]);  /* to nearest */ \
    _Pragma("unroll") for (int c = 0; c < COUNT; c++) ((DEVICE CHUNK*)(to))[c] = raw_[c];      \
  }

/* kernel */
  const int lane = (int)nv_thread.x % 32, warp = (int)nv_thread.x / 32;
  const int first_row = ((int)nv_group.x * WARPS + warp) * ROWS, head = (int)nv_group.y, batch = (int)nv_group.z;
  const int steps = ints[0];
  const int key_head = head / (HV / HK);
#if SLOTS
  const int slot = slots[batch];
  const bool live = slot >= 0 && slot < ints[1];
  const int state_at = ((live ? slot : 0) * HV + head) * DV + first_row;  // the first row's
  const DEVICE TS* state_in = pool;
#else
  const bool live = true;
  const int state_at = (batch * HV + head) * DV + first_row;
#endif
  const int share = lane * EK;  // this lane's first entry of a row
  float s[ROWS][EK];
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
#pragma unroll
    for (int e = 0; e < EK; e++) s[r][e] = 0.0f;
    // A branch: a dead slot's rows, or rows past DV, may lie outside the buffer.
    if (live && first_row + r < DV) LOAD_SHARE(CHUNK_S, S_CHUNKS, TS, state_in + (state_at + r) * DK + share, s[r])
#if STEPS_OUT
#pragma unroll
    for (int e = 0; e < EK; e++) s[r][e] = ROUND_STORAGE(s[r][e]);  // the composition starts from the stored state
#endif
  }
  for (int t = 0; t < steps; t++) {
    const int step_at = (batch * steps + t) * HV + head;    // into g, beta, and v's rows
    const int key_at = ((batch * steps + t) * HK + key_head) * DK + share;
    const float decay = to_float(g[step_at]), rate = to_float(beta[step_at]);
    float key[EK], query[EK];
    LOAD_SHARE(CHUNK_K, K_CHUNKS, TK, k + key_at, key)
    LOAD_SHARE(CHUNK_Q, Q_CHUNKS, TQ, q + key_at, query)
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      const int row = first_row + r;
      if (row >= DV) break;  // uniform across the SIMD group
      const float value = to_float(v[step_at * DV + row]);
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < EK; e++) {
        s[r][e] *= decay;
        dot += s[r][e] * key[e];
      }
      const float correction = (value - simd_sum(dot)) * rate;
      float out = 0.0f;
#pragma unroll
      for (int e = 0; e < EK; e++) {
        s[r][e] += key[e] * correction;
        out += s[r][e] * query[e];
      }
      out = simd_sum(out);
      if (lane == 0) from_float(live ? out : 0.0f, &y[step_at * DV + row]);
#if STEPS_OUT
#pragma unroll
      for (int e = 0; e < EK; e++) s[r][e] = ROUND_STORAGE(s[r][e]);
      STORE_SHARE(CHUNK_O, O_CHUNKS, TO, s[r], states + (step_at * DV + row) * DK + share)
#endif
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    if (first_row + r >= DV) break;
#if STATE_OUT
    STORE_SHARE(CHUNK_S, S_CHUNKS, TS, s[r], state_out + (state_at + r) * DK + share)
#endif
#if SLOTS
    if (live) STORE_SHARE(CHUNK_S, S_CHUNKS, TS, s[r], pool + (state_at + r) * DK + share)
#endif
  }

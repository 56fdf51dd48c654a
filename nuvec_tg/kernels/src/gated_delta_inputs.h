// The gated DeltaNet layer's inputs to the rule (Qwen3-Next, Qwen3.5), from its input projection
// in one launch: the causal depthwise convolution continuing each sequence from its state (the
// state updated in place), SiLU, q and k L2-normalised per head (q also scaled by 1 / sqrt(DK)),
// v as it is, and per value head the rate sigmoid(b) and the decay
// exp(-exp(a_log) * softplus(a + dt_bias)) (or its logarithm: DECAY_LOG).
//
// A threadgroup per head of the convolution's channels (HK q heads, HK k heads, HV v heads: grid x)
// and sequence (grid z), thread `me` the head's channel `me`; grid y splits the rows: group 0 takes
// the first FIRST rows (the rows whose window reaches into the state), then writes the new state;
// each later group one row, whose window lies in the call's own rows. So the old state is read and
// written by one thread per channel only, and a long call's rows run in parallel.
//
// The convolution's channels (`C = 2 HK DK + HV DV`) are all q, all k, then all v, the order of the
// state and the filters. A projection row holds them, then z, b and a (GROUPED 0: Qwen3.5's
// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) or, per key head, its q, k, its value
// heads' v and z, then per key head its value heads' b and a (GROUPED 1: Qwen3-Next's
// `in_proj_qkvz`, `in_proj_ba`).
//
// Rounding as the composition rounds: the state's values taken as TP, the convolution summed in
// float32 and rounded to TP (the projection's type), SiLU rounded to TP, the norms in float32, q,
// k and v stored as TP (the rule's inputs in the model's type, as transformers keeps them), the
// gates float32.
//
// Defines: TP, TC (the projection's and the state's types), HK, HV, DK, DV, TAPS, FIRST
// (max(TAPS - 1, 1)), THREADS (a multiple of 32 covering DK and DV), GROUPED, SLOTS (the state a
// pool row `slots[b]`; outside the pool: zero features, the pool unchanged), DECAY_LOG, L2_EPS (the
// l2 norm's epsilon over DK, as an RMS norm takes it) and RSQRT_DK (float literals).
// Runtime integers (`ints`): the rows T, the projection's row width, the pool's rows (SLOTS).

#define CHANNELS (2 * HK * DK + HV * DV)
#define GROUP (HV / HK)
#define KEY_BLOCK (2 * DK + 2 * GROUP * DV)  // GROUPED: a key head's columns of qkvz

// The projection's column of convolution channel `c` (of head `head`, its channel `d`).
INLINE int projected_column(int c, int head, int d) {
#if GROUPED
  if (c < HK * DK) return head * KEY_BLOCK + d;                      // q of key head `head`
  if (c < 2 * HK * DK) return (head - HK) * KEY_BLOCK + DK + d;      // k
  const int value_head = head - 2 * HK;
  return (value_head / GROUP) * KEY_BLOCK + 2 * DK + (value_head % GROUP) * DV + d;
#else
  return c;
#endif
}

// The columns of b and a of value head `h`.
INLINE int rate_column(int h) {
#if GROUPED
  return HK * KEY_BLOCK + (h / GROUP) * 2 * GROUP + h % GROUP;
#else
  return CHANNELS + HV * DV + h;
#endif
}
INLINE int decay_column(int h) {
#if GROUPED
  return rate_column(h) + GROUP;
#else
  return rate_column(h) + HV;
#endif
}

/* kernel */
  const int block = (int)nv_group.x, part = (int)nv_group.y, batch = (int)nv_group.z, me = (int)nv_thread.x;
  const int lane = me % 32, warp = me / 32;
  const int rows = ints[0], width = ints[1];
  const bool is_value = block >= 2 * HK;
  const int size = is_value ? DV : DK;                  // the head's channels
  const int c = is_value ? 2 * HK * DK + (block - 2 * HK) * DV + me : block * DK + me;
  const bool mine = me < size;                          // threads past the head's channels only sum zeros
  const int first = part == 0 ? 0 : FIRST - 1 + part;   // this group's rows
  const int last = part == 0 ? min(rows, FIRST) : first + 1;
  THREADGROUP float partial[THREADS / 32];
#if SLOTS
  const int slot = slots[batch];
  const bool live = slot >= 0 && slot < ints[2];
  const long state_at = (long)(live ? slot : 0) * (TAPS - 1) * CHANNELS + c;
#else
  const bool live = true;
  const long state_at = (long)batch * (TAPS - 1) * CHANNELS + c;
#endif
  const int column = mine ? projected_column(c, block, me) : 0;
  const DEVICE TP* row0 = projected + (long)batch * rows * width;  // the sequence's first row

  // The state's values for this channel (only group 0 reads them), and the filter.
  float history[TAPS], filter[TAPS];
#pragma unroll
  for (int j = 0; j < TAPS; j++) {
    history[j] = 0.0f;
    filter[j] = mine ? to_float(TP(to_float(filters[(long)c * TAPS + j]))) : 0.0f;  // as the projection's type
  }
  if (part == 0 && live && mine) {
#pragma unroll
    for (int j = 0; j + 1 < TAPS; j++) history[j] = to_float(TP(to_float(conv[state_at + (long)j * CHANNELS])));
  }

  for (int t = first; t < last; t++) {
    // window position j is sequence position t + j: the state's value j + t before the call's rows
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < TAPS; j++) {
      const int at = t + j - (TAPS - 1);                // the call's row, or negative: the state
      const float value = at >= 0 ? (mine ? to_float(row0[(long)at * width + column]) : 0.0f) : history[t + j];
      sum += filter[j] * value;
    }
    const float convolved = to_float(TP(sum));
    float feature = live ? to_float(TP(convolved / (1.0f + exp2(-convolved * LOG2E)))) : 0.0f;
    const long out_row = (long)batch * rows + t;
    if (is_value) {
      if (mine) v[out_row * HV * DV + (block - 2 * HK) * DV + me] = TP(feature);
      if (me == 0) {   // this value head's rate and decay
        const int h = block - 2 * HK;
        const float b_in = to_float(row0[(long)t * width + rate_column(h)]);
        const float a_in = to_float(row0[(long)t * width + decay_column(h)]) + to_float(dt_bias[h]);
        const float softplus = a_in > 20.0f ? a_in : log2(1.0f + exp2(a_in * LOG2E)) / LOG2E;
        const float log_decay = -exp2(to_float(a_log[h]) * LOG2E) * softplus;
        beta[out_row * HV + h] = 1.0f / (1.0f + exp2(-b_in * LOG2E));
#if DECAY_LOG
        g[out_row * HV + h] = log_decay;
#else
        g[out_row * HV + h] = exp2(log_decay * LOG2E);
#endif
      }
    } else {
      float squares;
      GROUP_SUM(feature * feature, squares)
      const float scale = 1.0f / sqrt(squares / (float)DK + L2_EPS);  // the norm kernel's RMS
      feature = feature * scale * RSQRT_DK;
      if (mine) {
        if (block < HK) q[(out_row * HK + block) * DK + me] = TP(feature * RSQRT_DK);
        else k[(out_row * HK + block - HK) * DK + me] = TP(feature);
      }
    }
  }

  // The new state: the last TAPS - 1 positions of (old state, the call's rows), as TP, in TC.
  if (part == 0 && live && mine) {
#pragma unroll
    for (int j = 0; j + 1 < TAPS; j++) {
      const int at = rows + j - (TAPS - 1);
      const float value = at >= 0 ? to_float(row0[(long)at * width + column]) : history[rows + j];
      conv[state_at + (long)j * CHANNELS] = TC(value);
    }
  }

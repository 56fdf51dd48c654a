// The gated delta rule, one SIMD group per value row of a head's state.
//
// A SIMD group serves row `row` of the `[DV, DK]` state of value head `head` (key head
// `head / (HV / HK)`) of batch item `batch`: lane `l` keeps the row's entries `l, l + 32, ...`
// (EK = DK / 32 of them) in float32 registers for the whole time loop, so the state is read once
// and written once per call. Per step:
//
//     s *= g;  remembered = sum(s * k);  s += k * beta * (v[row] - remembered);  y[row] = sum(s * q)
//
// with the sums by SIMD reductions. Variants: the final state (STATE_OUT), every step's state
// rounded to the storage type and continued from the rounded value (STEPS_OUT), or a pool read
// and written in place at `slots[batch]` (SLOTS; a slot outside the pool reads zeros, writes
// nothing and gives zero outputs).
//
// Defines: TQ, TK, TV, TG, TB (the types of q, k, v, g and beta), TS (state or pool), TO (steps' storage), DK, DV,
// HK, HV, EK, WARPS, STATE_OUT, STEPS_OUT, SLOTS, ROUND_STORAGE(x) (x rounded to TO, as float).
// Runtime integers (`ints`): the steps, and the pool's slots (SLOTS).

/* kernel */
  const int lane = (int)nv_thread.x % 32, warp = (int)nv_thread.x / 32;
  const int row = (int)nv_group.x * WARPS + warp, head = (int)nv_group.y, batch = (int)nv_group.z;
  const int steps = ints[0];
  if (row < DV) {
    const int key_head = head / (HV / HK);
#if SLOTS
    const int slot = slots[batch];
    const bool live = slot >= 0 && slot < ints[1];
    const int state_at = ((live ? slot : 0) * HV + head) * DV + row;
    const DEVICE TS* state_in = pool;
#else
    const bool live = true;
    const int state_at = (batch * HV + head) * DV + row;
#endif
    float s[EK];
#pragma unroll
    for (int e = 0; e < EK; e++) s[e] = 0.0f;
    if (live) {  // a branch, not a select: a dead slot's row may lie outside the pool
#pragma unroll
      for (int e = 0; e < EK; e++) s[e] = to_float(state_in[state_at * DK + lane + 32 * e]);
    }
#if STEPS_OUT
#pragma unroll
    for (int e = 0; e < EK; e++) s[e] = ROUND_STORAGE(s[e]);  // the composition starts from the stored state
#endif
    for (int t = 0; t < steps; t++) {
      const int step_at = (batch * steps + t) * HV + head;    // into g, beta, and v's rows
      const int key_at = ((batch * steps + t) * HK + key_head) * DK;
      const float decay = to_float(g[step_at]), rate = to_float(beta[step_at]);
      const float value = to_float(v[step_at * DV + row]);
      float key[EK], dot = 0.0f;
#pragma unroll
      for (int e = 0; e < EK; e++) {
        key[e] = to_float(k[key_at + lane + 32 * e]);
        s[e] *= decay;
        dot += s[e] * key[e];
      }
      const float correction = (value - simd_sum(dot)) * rate;
      float out = 0.0f;
#pragma unroll
      for (int e = 0; e < EK; e++) {
        s[e] += key[e] * correction;
        out += s[e] * to_float(q[key_at + lane + 32 * e]);
      }
      out = simd_sum(out);
      if (lane == 0) from_float(live ? out : 0.0f, &y[step_at * DV + row]);
#if STEPS_OUT
#pragma unroll
      for (int e = 0; e < EK; e++) {
        s[e] = ROUND_STORAGE(s[e]);
        from_float(s[e], &states[(step_at * DV + row) * DK + lane + 32 * e]);
      }
#endif
    }
#if STATE_OUT
#pragma unroll
    for (int e = 0; e < EK; e++) from_float(s[e], &state_out[state_at * DK + lane + 32 * e]);
#endif
#if SLOTS
    if (live) {
#pragma unroll
      for (int e = 0; e < EK; e++) from_float(s[e], &pool[state_at * DK + lane + 32 * e]);
    }
#endif
  }

// The second pass of decode attention: each query row's BLOCKS partial results (float32 sums of
// weighted values, maxima and weight sums, in base 2) merged, with the row's sink.
//
// Defines: T, DV, HQ, LQ, BLOCKS, SINKS, THREADS.

#define LOG2E 1.4426950408889634f

/* kernel */
  const int row = (int)nv_group.x, q_head = (row / LQ) % HQ, thread = (int)nv_thread.x;
  THREADGROUP float factors[BLOCKS];
  THREADGROUP float partial[THREADS / 32];
  float merged = -INFINITY;
  for (int b = thread; b < BLOCKS; b += THREADS) merged = max(merged, part_max[row * BLOCKS + b]);
  merged = simd_max(merged);
  if (thread % 32 == 0) partial[thread / 32] = merged;
  threadgroup_barrier();
  merged = -INFINITY;
  for (int w = 0; w < THREADS / 32; w++) merged = max(merged, partial[w]);
#if SINKS
  const float sink = to_float(sinks[q_head]) * LOG2E;
  merged = max(merged, sink);
#endif
  threadgroup_barrier();
  float total = 0.0f;
  for (int b = thread; b < BLOCKS; b += THREADS) {
    const float block_max = part_max[row * BLOCKS + b];
    const float factor = block_max == -INFINITY ? 0.0f : exp2(block_max - merged);
    factors[b] = factor;
    total += part_sum[row * BLOCKS + b] * factor;
  }
  total = simd_sum(total);
  if (thread % 32 == 0) partial[thread / 32] = total;
  threadgroup_barrier();
  total = 0.0f;
  for (int w = 0; w < THREADS / 32; w++) total += partial[w];
#if SINKS
  if (merged != -INFINITY) total += exp2(sink - merged);
#endif
  for (int e = thread; e < DV; e += THREADS) {
    float value = 0.0f;
    for (int b = 0; b < BLOCKS; b++) value += part_acc[(row * BLOCKS + b) * DV + e] * factors[b];
    from_float(total > 0.0f ? value / total : 0.0f, &out[row * DV + e]);
  }

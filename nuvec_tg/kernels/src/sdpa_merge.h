// The second pass of decode attention: each query row's BLOCKS partial results (float32 sums of
// weighted values, maxima and weight sums, in base 2) merged, with the row's sink.
//
// A threadgroup of THREADS threads serves one query row: SPLITS groups of DV / 4 threads, each
// thread merging float4 pieces of the value sums of every SPLITS-th block with their maxima and
// weight sums (all its loads independent, so they are in flight together); then the groups'
// results merge through threadgroup memory.
//
// Defines: T, DV, HQ, LQ, BLOCKS, SINKS, THREADS, SPLITS.

#define PIECES (DV / 4)

/* kernel */
  const int row = (int)nv_group.x, q_head = (row / LQ) % HQ, local_id = (int)nv_thread.x;
  const int piece = local_id % PIECES, split = local_id / PIECES;
  THREADGROUP float split_max[SPLITS], split_sum[SPLITS];
  THREADGROUP float split_acc[SPLITS * DV];
  if (split < SPLITS) {
    // This split's blocks: the largest maximum first, then the rescaled sums.
    float merged = -INFINITY;
#pragma unroll 8
    for (int b = split; b < BLOCKS; b += SPLITS) merged = max(merged, part_max[row * BLOCKS + b]);
    const DEVICE float4* sums = (const DEVICE float4*)part_acc;
    float4 value;
    value.x = value.y = value.z = value.w = 0.0f;
    float total = 0.0f;
#pragma unroll 8
    for (int b = split; b < BLOCKS; b += SPLITS) {
      const float factor = merge_factor(part_max[row * BLOCKS + b], merged);
      const float4 block_sum = sums[(row * BLOCKS + b) * PIECES + piece];
      total += part_sum[row * BLOCKS + b] * factor;
      value.x += block_sum.x * factor;
      value.y += block_sum.y * factor;
      value.z += block_sum.z * factor;
      value.w += block_sum.w * factor;
    }
    const int at = split * DV + piece * 4;
    split_acc[at] = value.x;
    split_acc[at + 1] = value.y;
    split_acc[at + 2] = value.z;
    split_acc[at + 3] = value.w;
    if (piece == 0) {
      split_max[split] = merged;
      split_sum[split] = total;
    }
  }
  threadgroup_barrier();
  float merged = -INFINITY;
  for (int s = 0; s < SPLITS; s++) merged = max(merged, split_max[s]);
#if SINKS
  const float sink = to_float(sinks[q_head]) * LOG2E;
  const float with_sink = max(merged, sink);
#else
  const float with_sink = merged;
#endif
  float total = 0.0f;
  for (int s = 0; s < SPLITS; s++) total += split_sum[s] * merge_factor(split_max[s], with_sink);
#if SINKS
  total += exp2(sink - with_sink);
#endif
  for (int e = local_id; e < DV; e += THREADS) {
    float value = 0.0f;
    for (int s = 0; s < SPLITS; s++) value += split_acc[s * DV + e] * merge_factor(split_max[s], with_sink);
    from_float(total > 0.0f ? value / total : 0.0f, &out[row * DV + e]);
  }

// Helpers every kernel may use, the same on each backend (after the backend's prelude).
#define LOG2E 1.4426950408889634f

// The factor that moves a softmax partial with maximum `part_max` (base 2) onto the maximum
// `merged_max`; an empty partial (maximum -inf) contributes nothing.
INLINE float merge_factor(float part_max, float merged_max) {
  return part_max == -INFINITY ? 0.0f : exp2(part_max - merged_max);
}

// Helpers every kernel may use, the same on each backend (after the backend's prelude).
#define LOG2E 1.4426950408889634f

// The factor that moves a softmax partial with maximum `part_max` (base 2) onto the maximum
// `merged_max`; an empty partial (maximum -inf) contributes nothing.
INLINE float merge_factor(float part_max, float merged_max) {
  return part_max == -INFINITY ? 0.0f : exp2(part_max - merged_max);
}

// SwiGLU's value silu(gate) * up as the composition rounds it: silu(g) = g / (1 + e^-g) rounded
// to T, times up, rounded to T (the GLU products' loads of x: qmv.h, gemv.h).
template <typename T> INLINE float swiglu_value(float gate, float up) {
  const float silu = to_float(T(gate / (1.0f + exp2(-gate * LOG2E))));
  return to_float(T(silu * up));
}

// The matrix-vector kernels' gathered entry (GATHER in qmv.h, gemv.h): threadgroup row nv_group.y
// is entry ENTRY, and its weight batch BATCH, or 0 with PICKED false where its pick is outside
// 0..BATCHES-1 (the entry then reads nothing and gives zeros).
#define GATHERED_ENTRY(ENTRY, BATCH, PICKED)                          \
  const int ENTRY = (int)nv_group.y;                                  \
  const bool PICKED = picks[ENTRY] >= 0 && picks[ENTRY] < BATCHES;    \
  const long BATCH = PICKED ? picks[ENTRY] : 0;

// Two results of an output row, at columns `column` and `column + 1` of N = `n_size`, rounded into
// `out` (the first one's place): one store where N is even (the pair is then aligned), else each
// column that exists.
template <typename T> INLINE void store_row_pair(float low, float high, DEVICE T* out, int column, int n_size) {
  if (n_size % 2 == 0 && column + 1 < n_size) {
    store_pair(low, high, out);
  } else {
    if (column < n_size) from_float(low, out);
    if (column + 1 < n_size) from_float(high, out + 1);
  }
}

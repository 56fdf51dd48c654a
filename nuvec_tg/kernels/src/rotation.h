// The rotary embedding's arithmetic, shared by rope.h and norm_rope.h so that a pair gets the same
// bits from either kernel: a row's scaled position and the rotation of a unit of pairs. Needs the
// defines TRADITIONAL and SCALE (a float literal).
//
//   position p = offset of batch item b + t (int32, wrapping as the composition's add); p * SCALE
//   angle of pair i = (p * SCALE) * inv_freq[i], in float32 (the composition's order)
//   (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) in float32, each output one fma (no compiler
//   chooses which product to contract)

// The scaled position of a row at step t of batch item b: offsets[b] with per_batch, else offsets[0].
INLINE float scaled_position(const DEVICE int* offsets, int per_batch, int b, int t) {
  const int position = (int)((uint)offsets[per_batch ? b : 0] + (uint)t);
  return (float)position * SCALE;
}

// Where rotating unit u of WIDTH pairs lies in its row: its first piece of WIDTH elements, and its
// second UNIT_GAP after (pairs (i, i + pairs) as two pieces, or 2 * WIDTH adjacent elements).
#define UNIT_FIRST(WIDTH, u) (TRADITIONAL ? 2 * (u) * (WIDTH) : (u) * (WIDTH))
#define UNIT_GAP(WIDTH, pairs) (TRADITIONAL ? (WIDTH) : (pairs))

// A unit's WIDTH pairs in v (its first piece, then its second) turned into out by the angles
// scaled * frequencies[j] (the unit's inverse frequencies).
#define ROTATE_UNIT(WIDTH, v, frequencies, scaled, out)                                              \
  _Pragma("unroll") for (int j_ = 0; j_ < (WIDTH); j_++) {                                          \
    const int p_ = TRADITIONAL ? 2 * j_ : j_, q_ = TRADITIONAL ? 2 * j_ + 1 : (WIDTH) + j_;          \
    float s_, c_;                                                                                   \
    sin_cos((scaled) * (frequencies)[j_], &s_, &c_);                                                \
    (out)[p_] = fma((v)[p_], c_, -((v)[q_] * s_));                                                  \
    (out)[q_] = fma((v)[p_], s_, (v)[q_] * c_);                                                     \
  }

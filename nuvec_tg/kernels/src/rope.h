// Rotary position embedding of rows of `length` features (`rope` in fast/rope.py): each thread
// takes one unit of a row, THREADS threads a threadgroup over every row's units in turn. A row's
// first `rotating` units each rotate VEC pairs (2 * VEC elements, two pieces of pieces.h); its
// other units each copy one piece of the features past `dims` unchanged.
//
//   pairs (TRADITIONAL 0): (i, i + pairs), unit u's pieces at u * VEC and u * VEC + pairs
//         (TRADITIONAL 1): (2i, 2i + 1), unit u's 2 * VEC consecutive elements at 2 * u * VEC
//   position p = offset of b + t (int32, wrapping) for row r = (b, ..., t): offsets[b], or offsets[0]
//   angle of pair i = (float(p) * SCALE) * inv_freq[i], in float32 (the composition's order)
//   (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) in float32, rounded once to TX
//
// No unit's arithmetic depends on another's, so a row's bits never depend on the batch. Every
// read is inside the row, the `pairs` inverse frequencies, or offsets[0] / offsets[b] with b < B.
//
// Defines: TX (x's and y's type), VEC (pairs a unit rotates, and elements a piece holds: it
// divides `pairs` and `length`), TRADITIONAL, THREADS, SCALE (a float literal), CHUNK_X and
// X_CHUNKS (how a piece is read and written, `chunks()` in program.py).
// Runtime integers (`ints`): the row length, pairs (dims / 2; not "half", a type), T (rows a
// sequence position repeats after), rows per batch item, rows, per_batch (offsets has B
// elements, else one).

/* kernel */
  const int length = ints[0], pairs = ints[1], steps = ints[2], batch_rows = ints[3], rows = ints[4];
  const int per_batch = ints[5];
  const int rotating = pairs / VEC, units = rotating + (length - 2 * pairs) / VEC;
  const int unit = (int)nv_group.x * THREADS + (int)nv_thread.x;  // rows * units < 2^31 (rope.py)
  if (unit >= rows * units) return;
  const int row = unit / units, u = unit % units;
  const long base = (long)row * length;
  float v[2 * VEC];
  if (u >= rotating) {  // a piece past dims, copied
    const long at = base + 2 * pairs + (long)(u - rotating) * VEC;
    LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + at, v)
    STORE_PIECE(CHUNK_X, X_CHUNKS, TX, v, y + at)
    return;
  }
  const int b = row / batch_rows, t = row % steps;
  const int position = (int)((uint)offsets[per_batch ? b : 0] + (uint)t);  // wraps as the composition's int32 add
  const float scaled = (float)position * SCALE;
  const long first = base + (TRADITIONAL ? 2L * u * VEC : (long)u * VEC);
  const long second = first + (TRADITIONAL ? VEC : pairs);
  LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + first, v)
  LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + second, v + VEC)
  float out[2 * VEC];
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    const float angle = scaled * inv_freq[u * VEC + j];
    float s, c;
    sin_cos(angle, &s, &c);
    const int p = TRADITIONAL ? 2 * j : j, q = TRADITIONAL ? 2 * j + 1 : VEC + j;
    out[p] = v[p] * c - v[q] * s;
    out[q] = v[p] * s + v[q] * c;
  }
  STORE_PIECE(CHUNK_X, X_CHUNKS, TX, out, y + first)
  STORE_PIECE(CHUNK_X, X_CHUNKS, TX, out + VEC, y + second)

// Rotary position embedding of rows of `length` features (`rope` in fast/rope.py): each thread
// takes one unit of a row, THREADS threads a threadgroup over every row's units in turn. A row's
// first `rotating` units each rotate VEC pairs (2 * VEC elements, two pieces of pieces.h); its
// other units each copy one piece of the features past `dims` unchanged.
//
//   pairs (TRADITIONAL 0): (i, i + pairs), unit u's pieces at u * VEC and u * VEC + pairs
//         (TRADITIONAL 1): (2i, 2i + 1), unit u's 2 * VEC consecutive elements at 2 * u * VEC
//   row r = (b, ..., t) at position offsets[b] (or offsets[0]) + t, turned as rotation.h says,
//   rounded once to TX
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
  const float scaled = scaled_position(offsets, per_batch, row / batch_rows, row % steps);
  const long first = base + UNIT_FIRST(VEC, u);
  const long second = first + UNIT_GAP(VEC, pairs);
  LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + first, v)
  LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + second, v + VEC)
  float out[2 * VEC];
  ROTATE_UNIT(VEC, v, inv_freq + u * VEC, scaled, out)
  STORE_PIECE(CHUNK_X, X_CHUNKS, TX, out, y + first)
  STORE_PIECE(CHUNK_X, X_CHUNKS, TX, out + VEC, y + second)

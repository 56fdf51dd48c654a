// Rows written into a paged pool at their slots (`paged_write` in fast/paged.py), in place: row r
// of the source [N, H, length] (N slots' rows of H heads each) goes to slot s = slots[r / H] as
// head r % H: row s % block_size of that head in block s / block_size of the pool
// [blocks, H, block_size, length]. A slot outside 0..places - 1 is skipped (its rows are not
// read). Each thread copies one piece of VEC elements of a row, THREADS threads a threadgroup over
// every row's pieces in turn, each element converted through float32 to TP (to nearest): where
// the types agree, every value as it is (a NaN stays a NaN; its payload is the dialect's). Rows
// naming one slot race: the slot's pieces come from either.
//
// Every read lies in the source's rows r < rows (as the strides place them) and in slots[0..rows / H - 1]; every write in the
// slot's row of the pool. No piece depends on another, nor on the row count.
//
// Defines: TS, TP (the source's and the pool's types), VEC, THREADS; CHUNK_S / S_CHUNKS and
// CHUNK_P / P_CHUNKS, how a piece is read and written (`chunks()` in program.py).
// Runtime integers (`ints`): the row length, rows (N * H), heads (H), block_size, places
// (blocks * block_size); then where the source's rows lie in its buffer: the first element and
// a slot's and a head's element strides (row r = (n, h) starts at first + n * slot stride + h *
// head stride; each a multiple of VEC, a row's elements consecutive; contiguous rows: 0, H *
// length, length), so that rows of a projection's output are read in place.

/* kernel */
  const int length = ints[0], rows = ints[1], heads = ints[2], block_size = ints[3], places = ints[4];
  const int pieces = length / VEC;
  const int unit = (int)nv_group.x * THREADS + (int)nv_thread.x;  // rows * pieces + THREADS < 2^31 (paged.py)
  if (unit >= rows * pieces) return;
  const int row = unit / pieces, p = unit % pieces;
  const int slot = slots[row / heads];
  if (slot < 0 || slot >= places) return;
  const long dest = (((long)(slot / block_size) * heads + row % heads) * block_size + slot % block_size) * length + (long)p * VEC;
  const long from = (long)ints[5] + (long)(row / heads) * ints[6] + (long)(row % heads) * ints[7] + (long)p * VEC;
  float v[VEC];
  LOAD_PIECE(CHUNK_S, S_CHUNKS, TS, source + from, v)
  STORE_PIECE(CHUNK_P, P_CHUNKS, TP, v, pool + dest)

// Rows gathered by index (`fast.take`): row i of y [count, row] is row indices[i] of x
// [rows, row], as its bits, or zeros for an index outside 0..rows - 1 (nothing read for it). A
// row is `chunks` chunks of CHUNK (the widest of 16, 8, 4 and 2 bytes dividing its bytes); each
// thread copies one chunk, THREADS threads a threadgroup over every row's chunks in turn. So a
// lookup reads the rows it names, where tinygrad's indexing compares every row of x with the index
// and reads them all.
//
// Every read lies in indices[0..count - 1] and in x's row indices[i]; every write in y's row i. No
// chunk depends on another, nor on the count.
//
// Defines: CHUNK (the chunk's type), ZERO (a chunk of zeros), THREADS. Runtime integers (`ints`):
// chunks a row, count, rows (count * chunks + THREADS < 2^31: paged.py's route).

/* kernel */
  const int chunks = ints[0], count = ints[1], rows = ints[2];
  const int unit = (int)nv_group.x * THREADS + (int)nv_thread.x;
  if (unit >= count * chunks) return;
  const int i = unit / chunks, c = unit % chunks;
  const int row = indices[i];
  y[(long)i * chunks + c] = row >= 0 && row < rows ? x[(long)row * chunks + c] : ZERO;

// What the decode passes (sdpa_decode.h, sdpa_decode_mma.h) agree on: a sequence's key count
// (paged: its length clamped to its table's pages), the first key its queries can see (with a
// window: the last query's window start, for queries at the end of the sequence) and the keys per
// block of the BLOCKS blocks, a multiple of BLOCK_ROUND (the matrix pass: its SIMD groups' 16-key
// tiles in whole rounds, so none waits at the block's end for another's extra tile; the last
// blocks may then be short or empty). Expanded in a kernel body where `batch` is defined.
#if PAGED
#define SEQUENCE_KEYS min(max(lengths[batch], 0), max_blocks * PAGE)
#else
#define SEQUENCE_KEYS K_LEN
#endif
#if WINDOW_ON
#define FIRST_VISIBLE_KEY(k_len) max(0, (k_len) - LQ + 1 - window)
#else
#define FIRST_VISIBLE_KEY(k_len) 0
#endif
#define KEYS_PER_BLOCK(k_len, range_start) ((max((k_len) - (range_start), 0) + BLOCKS * BLOCK_ROUND - 1) / (BLOCKS * BLOCK_ROUND) * BLOCK_ROUND)

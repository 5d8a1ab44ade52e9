/*
 * parallel/onebit.h - the 1-bit compressor on raw buffers, under the
 * compressed all-reduce of onebit.c (zs/onebit.h describes the packet and
 * the arithmetic). Not public; the tests check it against float64.
 */
#ifndef ZS_PARALLEL_ONEBIT_H
#define ZS_PARALLEL_ONEBIT_H

#include <stdint.h>

/* Bytes of the packet of n elements in blocks of `block` (a multiple of
 * 8): ceil(n / block) f32 scales, then ceil(n / 8) bytes of signs. */
int64_t zsi_onebit_packet_bytes(int64_t n, int64_t block);
/* With error feedback: c = x + err; packet = scales and signs of c;
 * err = c - decompress(c). x and err: n elements (x may equal err's
 * address only if the caller wants c = 2 x: do not); packet:
 * zsi_onebit_packet_bytes(n, block) bytes. Split across the pool by
 * blocks; the result does not depend on the thread count. */
void zsi_onebit_compress(const float *x, float *err, int64_t n, int64_t block,
                         uint8_t *packet);
/* out[k] = decompress(packet)_k for k < n. */
void zsi_onebit_decode(const uint8_t *packet, int64_t n, int64_t block, float *out);
/* acc[k] += w * decompress(packet)_k (the product rounded to f32, then
 * the sum). */
void zsi_onebit_accumulate(const uint8_t *packet, int64_t n, int64_t block, float w,
                           float *acc);

#endif

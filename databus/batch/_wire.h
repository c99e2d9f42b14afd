/* Byte-order helpers and BLAKE2b-64 for the compiled batch module (_native.pyx).
 *
 * BLAKE2b is written out from RFC 7693 (8-byte digest, no key): the event header's
 * partition key of a non-integer key is BLAKE2b-64 of the key bytes, top bit cleared
 * (databus/_hashing.py), and checking or filtering it per event must not cost a
 * hashlib object per event. Tests compare it with hashlib on random inputs.
 */
#ifndef DATABUS_WIRE_H
#define DATABUS_WIRE_H

#include <stdint.h>
#include <string.h>

static inline uint16_t db_be16(const unsigned char *p) {
    return (uint16_t)(((uint16_t)p[0] << 8) | p[1]);
}
static inline uint32_t db_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t db_be64(const unsigned char *p) {
    return ((uint64_t)db_be32(p) << 32) | db_be32(p + 4);
}
static inline void db_put16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v;
}
static inline void db_put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}
static inline void db_put64(unsigned char *p, uint64_t v) {
    db_put32(p, (uint32_t)(v >> 32)); db_put32(p + 4, (uint32_t)v);
}

static const uint64_t db_b2_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
    0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const unsigned char db_b2_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t db_rotr64(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t db_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

#define DB_B2_G(a, b, c, d, x, y)            \
    do {                                     \
        a = a + b + (x); d = db_rotr64(d ^ a, 32); \
        c = c + d; b = db_rotr64(b ^ c, 24); \
        a = a + b + (y); d = db_rotr64(d ^ a, 16); \
        c = c + d; b = db_rotr64(b ^ c, 63); \
    } while (0)

static void db_b2_compress(uint64_t h[8], const unsigned char block[128], uint64_t t, int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = db_le64(block + 8 * i);
    for (int i = 0; i < 8; i++) { v[i] = h[i]; v[i + 8] = db_b2_iv[i]; }
    v[12] ^= t;  /* the high half of the byte counter stays 0 below 2**64 bytes */
    if (last) v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const unsigned char *s = db_b2_sigma[r];
        DB_B2_G(v[0], v[4], v[8], v[12], m[s[0]], m[s[1]]);
        DB_B2_G(v[1], v[5], v[9], v[13], m[s[2]], m[s[3]]);
        DB_B2_G(v[2], v[6], v[10], v[14], m[s[4]], m[s[5]]);
        DB_B2_G(v[3], v[7], v[11], v[15], m[s[6]], m[s[7]]);
        DB_B2_G(v[0], v[5], v[10], v[15], m[s[8]], m[s[9]]);
        DB_B2_G(v[1], v[6], v[11], v[12], m[s[10]], m[s[11]]);
        DB_B2_G(v[2], v[7], v[8], v[13], m[s[12]], m[s[13]]);
        DB_B2_G(v[3], v[4], v[9], v[14], m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* databus._hashing.stable_key_hash: BLAKE2b with an 8-byte digest, the digest read
 * big-endian, the top bit cleared. */
static int64_t db_stable_key_hash(const unsigned char *data, size_t len) {
    uint64_t h[8];
    unsigned char block[128];
    uint64_t t = 0;
    for (int i = 0; i < 8; i++) h[i] = db_b2_iv[i];
    h[0] ^= 0x01010000ULL ^ 8ULL;  /* digest length 8, no key, fanout 1, depth 1 */
    while (len > 128) {
        t += 128;
        db_b2_compress(h, data, t, 0);
        data += 128;
        len -= 128;
    }
    memset(block, 0, sizeof block);
    if (len) memcpy(block, data, len);
    t += len;
    db_b2_compress(h, block, t, 1);
    /* The digest is h[0] in little-endian byte order; read those bytes big-endian. */
    return (int64_t)(__builtin_bswap64(h[0]) & 0x7fffffffffffffffULL);
}

/* CRC-32 (zlib's: reflected polynomial 0xEDB88320) with carry-less multiplication, for
 * x86-64 CPUs that have PCLMULQDQ and SSE4.1: the buffer is folded 64 bytes at a time
 * into four 128-bit lanes, the lanes into one, then reduced to 32 bits (Barrett), after
 * Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" (Intel,
 * 2009). zlib's own crc32 does the bytes that do not fill 16, and everything on other
 * CPUs; tests compare the two on random lengths and contents. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <zlib.h>
#define DB_HAVE_CLMUL_CRC 1

__attribute__((target("pclmul,sse4.1")))
static uint32_t db_crc32_clmul(uint32_t crc, const unsigned char *p, size_t n) {
    /* Folding constants: x^(k) mod P for the fold distances, bit-reflected. */
    const __m128i fold4 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i fold1 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i fold64 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i barrett = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
    __m128i a, b, c, d, t;
    size_t whole;
    if (n < 64)
        return (uint32_t)crc32(crc, p, (unsigned int)n);
    whole = n & ~(size_t)15;
    crc = ~crc;  /* the register as zlib keeps it internally */
    a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
    b = _mm_loadu_si128((const __m128i *)(p + 16));
    c = _mm_loadu_si128((const __m128i *)(p + 32));
    d = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
    whole -= 64;
    while (whole >= 64) {
#define DB_FOLD(x, k, next) \
        t = _mm_clmulepi64_si128(x, k, 0x00); \
        x = _mm_clmulepi64_si128(x, k, 0x11); \
        x = _mm_xor_si128(_mm_xor_si128(x, t), next)
        DB_FOLD(a, fold4, _mm_loadu_si128((const __m128i *)p));
        DB_FOLD(b, fold4, _mm_loadu_si128((const __m128i *)(p + 16)));
        DB_FOLD(c, fold4, _mm_loadu_si128((const __m128i *)(p + 32)));
        DB_FOLD(d, fold4, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
        whole -= 64;
    }
    DB_FOLD(a, fold1, b);
    DB_FOLD(a, fold1, c);
    DB_FOLD(a, fold1, d);
    while (whole >= 16) {
        DB_FOLD(a, fold1, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
        whole -= 16;
    }
#undef DB_FOLD
    /* 128 bits to 64, to 32, then the Barrett reduction. */
    t = _mm_clmulepi64_si128(a, fold1, 0x10);
    a = _mm_xor_si128(_mm_srli_si128(a, 8), t);
    t = _mm_srli_si128(a, 4);
    a = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(a, low32), fold64, 0x00), t);
    t = _mm_and_si128(a, low32);
    t = _mm_clmulepi64_si128(t, barrett, 0x10);
    t = _mm_and_si128(t, low32);
    t = _mm_clmulepi64_si128(t, barrett, 0x00);
    a = _mm_xor_si128(a, t);
    crc = ~(uint32_t)_mm_extract_epi32(a, 1);
    return n ? (uint32_t)crc32(crc, p, (unsigned int)n) : crc;
}

static int db_clmul_usable = -1;

/* CRC-32 of p[0:n] continuing from crc, by the fastest way this CPU has. */
static inline uint32_t db_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    if (db_clmul_usable < 0)
        db_clmul_usable = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    if (db_clmul_usable && n >= 64)
        return db_crc32_clmul(crc, p, n);
    return (uint32_t)crc32(crc, p, (unsigned int)n);
}
#else
#include <zlib.h>
static inline uint32_t db_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    return (uint32_t)crc32(crc, p, (unsigned int)n);
}
#endif

#endif

// Kernel bodies. Included by isa_*.cpp inside `namespace tbl::<level>`; do not
// include anywhere else (each inclusion must live in its own namespace so the
// differently-compiled copies never merge at link time).
//
// Everything here is integer arithmetic or plain copies of table entries, so the
// result does not depend on how the compiler vectorizes it. The float paths
// (normalized outputs computed instead of looked up, AVX2 only) are used only
// after they have been checked against the whole table (affine16_matches,
// affine32_matches); the avx512 level looks 32-bit outputs up in registers instead.

// ---------------------------------------------------------------- image writers
//
// A sample is written row by row: first the row's bytes are put in output order
// (flip and layout applied) into a small buffer, then mapped through the table
// (or copied for uint8 output). The mapping step is a table lookup per element
// (hardware gathers on the AVX2 level) or, where verified, the arithmetic path.

// dst[x] = src[n - 1 - x] for x < n, eight bytes per step.
static inline void reverse_bytes(const uint8_t* __restrict src, int64_t n, uint8_t* __restrict dst) {
    int64_t x = 0;
    for (; x + 8 <= n; x += 8) {
        uint64_t v;
        std::memcpy(&v, src + n - x - 8, 8);
        v = __builtin_bswap64(v);
        std::memcpy(dst + x, &v, 8);
    }
    for (; x < n; ++x) dst[x] = src[n - 1 - x];
}

#if defined(__AVX2__)
// pshufb masks that split 16 interleaved 3-byte pixels (three 16-byte chunks) into
// three 16-byte planes: kMasks.m[reverse][plane][chunk] picks, for plane byte i,
// byte `plane` of pixel i (or of pixel 15 - i when reversed) if that byte lies in
// `chunk`, and zero (0x80) otherwise; OR-ing the three chunks completes the plane.
struct DeinterleaveMasks {
    int8_t m[2][3][3][16];
};
static constexpr DeinterleaveMasks make_deinterleave_masks() {
    DeinterleaveMasks k{};
    for (int rev = 0; rev < 2; ++rev)
        for (int c = 0; c < 3; ++c)
            for (int q = 0; q < 3; ++q)
                for (int i = 0; i < 16; ++i) {
                    const int byte = 3 * (rev ? 15 - i : i) + c;
                    k.m[rev][c][q][i] = static_cast<int8_t>(byte / 16 == q ? byte % 16 : 0x80);
                }
    return k;
}
alignas(16) static constexpr DeinterleaveMasks kMasks = make_deinterleave_masks();

// Planes of 16 pixels starting at `px` (48 bytes); kReverse writes them in reverse pixel order.
template <bool kReverse>
static inline void deinterleave16(const uint8_t* px, uint8_t* d0, uint8_t* d1, uint8_t* d2) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(px));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(px + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(px + 32));
    uint8_t* dst[3] = {d0, d1, d2};
    for (int p = 0; p < 3; ++p) {
        const auto& m = kMasks.m[kReverse ? 1 : 0][p];
        const __m128i v = _mm_or_si128(
            _mm_or_si128(_mm_shuffle_epi8(a, _mm_load_si128(reinterpret_cast<const __m128i*>(m[0]))),
                         _mm_shuffle_epi8(b, _mm_load_si128(reinterpret_cast<const __m128i*>(m[1])))),
            _mm_shuffle_epi8(c, _mm_load_si128(reinterpret_cast<const __m128i*>(m[2]))));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst[p]), v);
    }
}
#endif

// One image row (W pixels, adjacent pixels `sx` bytes apart) in output order:
// CHW -> C planes of W bytes each `plane` bytes apart; HWC -> W * C interleaved bytes.
template <int C, bool kContiguous>
static void row_bytes_impl(const uint8_t* __restrict row, int64_t W, int64_t sx_runtime, bool flip, bool chw,
                           uint8_t* __restrict dst, int64_t plane) {
    // A compile-time pixel step (C) lets the compiler vectorize the deinterleave.
    const int64_t sx = kContiguous ? C : sx_runtime;
    if (chw) {
        int64_t x0 = 0;  // pixels before x0 are done
#if defined(__AVX2__)
        if (C == 3 && kContiguous) {
            // Byte shuffles, 16 pixels at a time; the compiler's strided loops are ~5x slower.
            uint8_t* d0 = dst;
            uint8_t* d1 = dst + plane;
            uint8_t* d2 = dst + 2 * plane;
            if (flip) {
                // Output block [x, x + 16) holds source pixels [W - 16 - x, W - x), reversed. The
                // blocks go in ascending source order: reading a row backwards defeated the
                // hardware prefetcher and made flipped batches ~40% slower on 2 threads.
                const int64_t blocks = W / 16;
                for (int64_t k = blocks - 1; k >= 0; --k) {
                    const int64_t x = 16 * k;
                    deinterleave16<true>(row + (W - 16 - x) * 3, d0 + x, d1 + x, d2 + x);
                }
                x0 = 16 * blocks;
            } else {
                for (; x0 + 16 <= W; x0 += 16) deinterleave16<false>(row + x0 * 3, d0 + x0, d1 + x0, d2 + x0);
            }
            if (x0 == W) return;
        }
#endif
        thread_local std::vector<uint8_t> forward;
        if (flip && forward.size() < static_cast<size_t>(W)) forward.resize(W);
        const int64_t n = W - x0;  // the remaining pixels: x0 .. W - 1 of the output row
        for (int c = 0; c < C; ++c) {
            uint8_t* __restrict o = dst + c * plane + x0;
            if (flip) {
                // Output x reads pixel W - 1 - x: the remaining outputs read pixels 0 .. n - 1,
                // backwards. Deinterleave forwards, then reverse: a strided read that also
                // runs backwards defeats the vectorizer and made flipped batches ~40% slower.
                uint8_t* __restrict f = forward.data();
                for (int64_t x = 0; x < n; ++x) f[x] = row[x * sx + c];
                reverse_bytes(f, n, o);
            } else {
                const uint8_t* __restrict r = row + x0 * sx;
                for (int64_t x = 0; x < n; ++x) o[x] = r[x * sx + c];
            }
        }
    } else if (flip) {
        for (int64_t x = 0; x < W; ++x)
            for (int c = 0; c < C; ++c) dst[x * C + c] = row[(W - 1 - x) * sx + c];
    } else {
        for (int64_t x = 0; x < W; ++x)
            for (int c = 0; c < C; ++c) dst[x * C + c] = row[x * sx + c];
    }
}

template <int C>
static void row_bytes(const uint8_t* row, int64_t W, int64_t sx, bool flip, bool chw, uint8_t* dst, int64_t plane) {
    if (sx == C) row_bytes_impl<C, true>(row, W, sx, flip, chw, dst, plane);
    else row_bytes_impl<C, false>(row, W, sx, flip, chw, dst, plane);
}

// out[j] = table[(j % C) * 256 + idx[j]] for j < n (C = 1: a single 256-entry table).
template <int C, typename T>
static void lut_scalar(const uint8_t* __restrict idx, int64_t n, const T* __restrict table, T* __restrict out) {
    if (C == 1) {
        for (int64_t j = 0; j < n; ++j) out[j] = table[idx[j]];
        return;
    }
    int64_t j = 0;
    for (; j + C <= n; j += C)
        for (int c = 0; c < C; ++c) out[j + c] = table[c * 256 + idx[j + c]];
    for (; j < n; ++j) out[j] = table[(j % C) * 256 + idx[j]];
}

#if defined(__AVX2__)
// Lane offsets (channel * 256) for 8 consecutive interleaved elements starting at
// element phase 0, 8 and 16 of a 24-element (8-pixel) block.
static inline __m256i channel_offsets(int C, int block) {
    alignas(32) int32_t o[8];
    for (int i = 0; i < 8; ++i) o[i] = C == 1 ? 0 : ((block * 8 + i) % C) * 256;
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(o));
}

static inline __m256i gather8(const uint32_t* table, const uint8_t* idx, __m256i offs) {
    const __m256i i = _mm256_add_epi32(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(idx))), offs);
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), i, 4);
}

template <int C>
static void lut_row32(const uint8_t* idx, int64_t n, const uint32_t* table, uint32_t* out) {
    constexpr int64_t step = C == 1 ? 8 : 24;
    const __m256i o0 = channel_offsets(C, 0), o1 = channel_offsets(C, 1), o2 = channel_offsets(C, 2);
    int64_t j = 0;
    for (; j + step <= n; j += step) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), gather8(table, idx + j, o0));
        if (C != 1) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j + 8), gather8(table, idx + j + 8, o1));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j + 16), gather8(table, idx + j + 16, o2));
        }
    }
    // j is a multiple of C, so the scalar tail starts on channel 0.
    lut_scalar<C>(idx + j, n - j, table, out + j);
}

// 16-bit outputs gather from the zero-extended 32-bit copy of the table, then
// pack pairs of vectors (values <= 0xFFFF, so unsigned saturation is exact).
template <int C>
static void lut_row16(const uint8_t* idx, int64_t n, const uint16_t* table, const uint32_t* wide, uint16_t* out) {
    constexpr int64_t step = C == 1 ? 16 : 48;
    const __m256i o0 = channel_offsets(C, 0), o1 = channel_offsets(C, 1), o2 = channel_offsets(C, 2);
    auto pack_store = [](uint16_t* dst, __m256i a, __m256i b) {
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), p);
    };
    int64_t j = 0;
    for (; j + step <= n; j += step) {
        if (C == 1) {
            pack_store(out + j, gather8(wide, idx + j, o0), gather8(wide, idx + j + 8, o0));
        } else {
            // 48 elements = two 24-element blocks; offsets repeat every 24.
            pack_store(out + j, gather8(wide, idx + j, o0), gather8(wide, idx + j + 8, o1));
            pack_store(out + j + 16, gather8(wide, idx + j + 16, o2), gather8(wide, idx + j + 24, o0));
            pack_store(out + j + 32, gather8(wide, idx + j + 32, o1), gather8(wide, idx + j + 40, o2));
        }
    }
    lut_scalar<C>(idx + j, n - j, table, out + j);
}

// ---- float16 / bfloat16 by arithmetic (used only after affine16_matches succeeded)
// float32 v * a + b: one multiply and one add, never fused (the build disables
// contraction and this level is compiled without FMA).
static inline __m256 affine8(const uint8_t* idx, __m256 a, __m256 b) {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(idx))));
    return _mm256_add_ps(_mm256_mul_ps(v, a), b);
}

// bfloat16 of sixteen consecutive elements idx[0..15], rounded nearest with ties away
// from zero (add 0x8000, keep the high half). Ties to even would cost three more
// operations per vector; the two differ only on exact ties (low 16 bits 0x8000), and
// affine16_matches accepts this path only when every one of the 256 values per
// channel equals the table (which is rounded ties-to-even from float64), so no
// output ever differs from the table.
//
// No pack: the sixteen bytes are split into the even elements and the odd ones
// (zero-extended to 32 bits, lane i holding element 2i, resp. 2i + 1). Lane i then
// yields the bfloat16 of its even element in its low half (shifted down) and that
// of its odd element in its high half (already in place): one word blend gives the
// sixteen results in output order. 12 vector operations per 16 elements, against
// float16's 13 (two-op conversions) and the 14 of converting elements 0-7 and 8-15
// and packing, which kept bfloat16 ~7% behind float16 (the loop is bound by
// vector-operation throughput).
// `ae`/`be` hold a and b for the even elements, `ao`/`bo` for the odd ones.
static inline __m256i bf16x16(const uint8_t* idx, __m256 ae, __m256 be, __m256 ao, __m256 bo) {
    // The same 16 bytes in both 128-bit halves (a load, no vector operation); the byte
    // shuffles work within each half: the low half takes elements 0-7, the high 8-15.
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(idx)));
    const __m256i pick_even = _mm256_setr_epi8(0, -1, -1, -1, 2, -1, -1, -1, 4, -1, -1, -1, 6, -1, -1, -1,  //
                                               8, -1, -1, -1, 10, -1, -1, -1, 12, -1, -1, -1, 14, -1, -1, -1);
    const __m256i pick_odd = _mm256_setr_epi8(1, -1, -1, -1, 3, -1, -1, -1, 5, -1, -1, -1, 7, -1, -1, -1,  //
                                              9, -1, -1, -1, 11, -1, -1, -1, 13, -1, -1, -1, 15, -1, -1, -1);
    const __m256 even = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(bytes, pick_even));
    const __m256 odd = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(bytes, pick_odd));
    const __m256i half = _mm256_set1_epi32(0x8000);
    const __m256i ye = _mm256_add_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(even, ae), be)), half);
    const __m256i yo = _mm256_add_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(odd, ao), bo)), half);
    return _mm256_blend_epi16(_mm256_srli_epi32(ye, 16), yo, 0xAA);  // odd words from yo
}

static inline uint16_t affine1(int kind, uint8_t v, float a, float b) {
    const __m128 y = _mm_add_ss(_mm_mul_ss(_mm_set_ss(static_cast<float>(v)), _mm_set_ss(a)), _mm_set_ss(b));
    if (kind == 1) return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT), 0));
    const uint32_t x = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_castps_si128(y)));
    return static_cast<uint16_t>((x + 0x8000u) >> 16);  // as bf16x16
}

// out[j] = round(v * a[j % C] + b[j % C]) for j < n, as float16 (kind 1) or bfloat16 bits (kind 2).
template <int C>
static void affine_row16(const uint8_t* idx, int64_t n, int kind, const float* a, const float* b, uint16_t* out) {
    constexpr int64_t step = C == 1 ? 16 : 48;
    int64_t j = 0;
    if (kind == 1) {
        __m256 va[3], vb[3];
        for (int blk = 0; blk < 3; ++blk) {
            alignas(32) float ta[8], tb[8];
            for (int i = 0; i < 8; ++i) ta[i] = a[(blk * 8 + i) % C], tb[i] = b[(blk * 8 + i) % C];
            va[blk] = _mm256_load_ps(ta), vb[blk] = _mm256_load_ps(tb);
        }
        for (; j + step <= n; j += step) {
            for (int64_t k = 0; k < step; k += 16) {
                // Two conversions per 32-byte store: as many stores per element as
                // float32 output would need was what held float16 back.
                const int b0 = C == 1 ? 0 : static_cast<int>((k / 8) % 3);
                const int b1 = C == 1 ? 0 : static_cast<int>((k / 8 + 1) % 3);
                const __m128i lo = _mm256_cvtps_ph(affine8(idx + j + k, va[b0], vb[b0]), _MM_FROUND_TO_NEAREST_INT);
                const __m128i hi = _mm256_cvtps_ph(affine8(idx + j + k + 8, va[b1], vb[b1]), _MM_FROUND_TO_NEAREST_INT);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j + k), _mm256_set_m128i(hi, lo));
            }
        }
    } else {
        // Group g covers elements 16g .. 16g + 15 of the 48-element period (one group for
        // C == 1); lane i of a group holds elements 2i (even) and 2i + 1 (odd).
        constexpr int groups = C == 1 ? 1 : 3;
        __m256 ae[groups], be[groups], ao[groups], bo[groups];
        for (int g = 0; g < groups; ++g) {
            alignas(32) float tae[8], tbe[8], tao[8], tbo[8];
            for (int i = 0; i < 8; ++i) {
                tae[i] = a[(16 * g + 2 * i) % C], tbe[i] = b[(16 * g + 2 * i) % C];
                tao[i] = a[(16 * g + 2 * i + 1) % C], tbo[i] = b[(16 * g + 2 * i + 1) % C];
            }
            ae[g] = _mm256_load_ps(tae), be[g] = _mm256_load_ps(tbe);
            ao[g] = _mm256_load_ps(tao), bo[g] = _mm256_load_ps(tbo);
        }
        for (; j + step <= n; j += step) {
            for (int g = 0; g < groups; ++g) {
                const __m256i v = bf16x16(idx + j + 16 * g, ae[g], be[g], ao[g], bo[g]);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j + 16 * g), v);
            }
        }
    }
    for (; j < n; ++j) out[j] = affine1(kind, idx[j], a[j % C], b[j % C]);
}

static bool affine16_matches(int kind, int64_t C, const float* a, const float* b, const uint16_t* table) {
    if (kind != 1 && kind != 2) return false;
    alignas(32) uint8_t v[256];
    alignas(32) uint16_t got[256];
    for (int i = 0; i < 256; ++i) v[i] = static_cast<uint8_t>(i);
    for (int64_t c = 0; c < C; ++c) {
        affine_row16<1>(v, 256, kind, a + c, b + c, got);  // the vector path (256 = 16 blocks of 16)
        if (std::memcmp(got, table + c * 256, sizeof(got)) != 0) return false;
        for (int i = 0; i < 256; ++i)  // the scalar path used for row tails
            if (affine1(kind, v[i], a[c], b[c]) != table[c * 256 + i]) return false;
    }
    return true;
}

// ---- float32 by arithmetic in float64 (used only after affine32_matches succeeded)
static inline __m256 affine8_f32(const uint8_t* idx, __m256d alo, __m256d blo, __m256d ahi, __m256d bhi) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(idx)));
    const __m256d lo = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(v)), alo), blo);
    const __m256d hi = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(v, 1)), ahi), bhi);
    return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}

static inline float affine1_f32(uint8_t v, double a, double b) {
    const __m128d y = _mm_add_sd(_mm_mul_sd(_mm_set_sd(static_cast<double>(v)), _mm_set_sd(a)), _mm_set_sd(b));
    return _mm_cvtss_f32(_mm_cvtsd_ss(_mm_setzero_ps(), y));
}

// out[j] = float32(v * a[j % C] + b[j % C]) (float64 multiply, float64 add, one rounding).
template <int C>
static void affine_row32(const uint8_t* idx, int64_t n, const double* a, const double* b, uint32_t* out) {
    __m256d va[6], vb[6];  // 24-element period in groups of 4 lanes
    for (int g = 0; g < 6; ++g) {
        alignas(32) double ta[4], tb[4];
        for (int i = 0; i < 4; ++i) ta[i] = a[(g * 4 + i) % C], tb[i] = b[(g * 4 + i) % C];
        va[g] = _mm256_load_pd(ta), vb[g] = _mm256_load_pd(tb);
    }
    constexpr int64_t step = C == 1 ? 8 : 24;
    int64_t j = 0;
    for (; j + step <= n; j += step) {
        for (int64_t k = 0; k < step; k += 8) {
            const int g = C == 1 ? 0 : static_cast<int>(k / 4);
            const __m256 y = affine8_f32(idx + j + k, va[g], vb[g], va[C == 1 ? 0 : g + 1], vb[C == 1 ? 0 : g + 1]);
            _mm256_storeu_ps(reinterpret_cast<float*>(out + j + k), y);
        }
    }
    for (; j < n; ++j) {
        const float f = affine1_f32(idx[j], a[j % C], b[j % C]);
        std::memcpy(out + j, &f, 4);
    }
}

static bool affine32_matches(int64_t C, const double* a, const double* b, const uint32_t* table) {
    alignas(32) uint8_t v[256];
    alignas(32) uint32_t got[256];
    for (int i = 0; i < 256; ++i) v[i] = static_cast<uint8_t>(i);
    for (int64_t c = 0; c < C; ++c) {
        affine_row32<1>(v, 256, a + c, b + c, got);  // the vector path (256 = 32 blocks of 8)
        if (std::memcmp(got, table + c * 256, sizeof(got)) != 0) return false;
        for (int i = 0; i < 256; ++i) {  // the scalar path used for row tails
            const float f = affine1_f32(v[i], a[c], b[c]);
            if (std::memcmp(&f, table + c * 256 + i, 4) != 0) return false;
        }
    }
    return true;
}
#define TBL_HAVE_AFFINE16 1
#else
template <int C>
static void lut_row32(const uint8_t* idx, int64_t n, const uint32_t* table, uint32_t* out) {
    lut_scalar<C>(idx, n, table, out);
}
template <int C>
static void lut_row16(const uint8_t* idx, int64_t n, const uint16_t* table, const uint32_t*, uint16_t* out) {
    lut_scalar<C>(idx, n, table, out);
}
#endif

#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
// ---- 32-bit outputs by table lookup in registers, 64 per step (the avx512 level: AVX-512 VBMI)
//
// One channel's 256 entries as four byte planes (byte k of every entry), each 256 bytes in four registers.
// vpermt2b looks a byte up in 128 of them by the index's low 7 bits; bit 7 picks the half. The four looked-up
// planes interleave back into entries, so every output is a table entry, copied: any table, same bits.
struct BytePlanes32 {
    __m512i plane[4][4];  // plane[k][q]: byte k of entries 64q .. 64q + 63
};

static void byte_planes32(const uint32_t* table, BytePlanes32& P) {
    alignas(64) uint8_t bytes[4][256];
    for (int q = 0; q < 16; ++q) {
        const __m512i e = _mm512_loadu_si512(table + 16 * q);
        for (int k = 0; k < 4; ++k)
            _mm_store_si128(reinterpret_cast<__m128i*>(bytes[k] + 16 * q), _mm512_cvtepi32_epi8(_mm512_srli_epi32(e, 8 * k)));
    }
    for (int k = 0; k < 4; ++k)
        for (int q = 0; q < 4; ++q) P.plane[k][q] = _mm512_load_si512(bytes[k] + 64 * q);
}

// The unpacks in lut_row32_planes interleave within 128-bit lanes: index byte 16L + 4m + i lands in output
// 16m + 4L + i. Reordering the indices first by this permutation puts every output where it belongs.
struct LaneOrder {
    alignas(64) uint8_t b[64];
};
static constexpr LaneOrder lane_order() {
    LaneOrder o{};
    for (int L = 0; L < 4; ++L)
        for (int m = 0; m < 4; ++m)
            for (int i = 0; i < 4; ++i) o.b[16 * L + 4 * m + i] = static_cast<uint8_t>(16 * m + 4 * L + i);
    return o;
}
static constexpr LaneOrder kLaneOrder = lane_order();

// out[j] = table[idx[j]] for j < n, the table given as its byte planes.
static void lut_row32_planes(const uint8_t* idx, int64_t n, const BytePlanes32& P, uint32_t* out) {
    const __m512i reorder = _mm512_load_si512(kLaneOrder.b);
    __m512i pl[4][4];
    for (int k = 0; k < 4; ++k)
        for (int q = 0; q < 4; ++q) pl[k][q] = P.plane[k][q];
    for (int64_t j = 0; j < n; j += 64) {
        const int64_t left = n - j;
        const __mmask64 in = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
        const __m512i x = _mm512_permutexvar_epi8(reorder, _mm512_maskz_loadu_epi8(in, idx + j));
        const __mmask64 upper = _mm512_movepi8_mask(x);  // index bit 7: entries 128 .. 255
        __m512i b[4];
        for (int k = 0; k < 4; ++k)
            b[k] = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(pl[k][0], x, pl[k][1]),
                                          _mm512_permutex2var_epi8(pl[k][2], x, pl[k][3]));
        const __m512i lo01 = _mm512_unpacklo_epi8(b[0], b[1]), hi01 = _mm512_unpackhi_epi8(b[0], b[1]);
        const __m512i lo23 = _mm512_unpacklo_epi8(b[2], b[3]), hi23 = _mm512_unpackhi_epi8(b[2], b[3]);
        const __m512i e[4] = {_mm512_unpacklo_epi16(lo01, lo23), _mm512_unpackhi_epi16(lo01, lo23),
                              _mm512_unpacklo_epi16(hi01, hi23), _mm512_unpackhi_epi16(hi01, hi23)};
        for (int m = 0; m < 4; ++m) {
            const int64_t rest = left - 16 * m;  // outputs j + 16m .. j + 16m + 15 that exist
            if (rest <= 0) break;
            const __mmask16 keep = rest >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << rest) - 1);
            _mm512_mask_storeu_epi32(out + j + 16 * m, keep, e[m]);
        }
    }
}
#define TBL_HAVE_LUT32_PLANES 1
#endif

// Writes one sample. `Map(row, n, channel_table_offset, dst)` maps n bytes whose
// channel pattern starts at channel 0 (HWC) or is the single channel (CHW).
template <int C, typename T, typename Map>
static void write_rows(const uint8_t* src, const tbl::WriteSpec& s, T* out, Map map) {
    const int64_t H = s.H, W = s.W;
    const int64_t sy = s.transposed ? C : (s.row_stride ? s.row_stride : W * C);
    const int64_t sx = s.transposed ? H * C : C;
    thread_local std::vector<uint8_t> buf;
    if (buf.size() < static_cast<size_t>(W * C)) buf.resize(W * C);
    for (int64_t y = 0; y < H; ++y) {
        row_bytes<C>(src + y * sy, W, sx, s.flip, s.chw, buf.data(), W);
        if (s.chw) {
            for (int c = 0; c < C; ++c) map(buf.data() + c * W, W, c, out + (c * H + y) * W);
        } else {
            map(buf.data(), W * C, -1, out + y * W * C);
        }
    }
}

static void write_u8(const uint8_t* src, const tbl::WriteSpec& s, uint8_t* out) {
    const bool plain = !s.flip && !s.transposed && (s.row_stride == 0 || s.row_stride == s.W * s.C);
    if (plain && (!s.chw || s.C == 1)) {  // untouched image (CHW == HWC for one channel)
        std::memcpy(out, src, static_cast<size_t>(s.H * s.W * s.C));
        return;
    }
    const int64_t H = s.H, W = s.W, C = s.C;
    const int64_t sy = s.transposed ? C : (s.row_stride ? s.row_stride : W * C);
    const int64_t sx = s.transposed ? H * C : C;
    for (int64_t y = 0; y < H; ++y) {
        if (s.chw) {
            if (C == 3) row_bytes<3>(src + y * sy, W, sx, s.flip, true, out + y * W, H * W);
            else row_bytes<1>(src + y * sy, W, sx, s.flip, true, out + y * W, H * W);
        } else {
            if (C == 3) row_bytes<3>(src + y * sy, W, sx, s.flip, false, out + y * W * C, 0);
            else row_bytes<1>(src + y * sy, W, sx, s.flip, false, out + y * W, 0);
        }
    }
}

static void write_lut16(const uint8_t* src, const tbl::WriteSpec& s, const tbl::Lut16& lut, uint16_t* out) {
    const uint16_t* table = lut.table;
    const uint32_t* wide = lut.wide;
#if defined(TBL_HAVE_AFFINE16)
    if (lut.affine_kind != 0) {
        const int kind = lut.affine_kind;
        if (s.C == 3) {
            write_rows<3>(src, s, out, [&](const uint8_t* b, int64_t n, int c, uint16_t* o) {
                if (c < 0) affine_row16<3>(b, n, kind, lut.a, lut.b, o);
                else affine_row16<1>(b, n, kind, lut.a + c, lut.b + c, o);
            });
        } else {
            write_rows<1>(src, s, out, [&](const uint8_t* b, int64_t n, int, uint16_t* o) {
                affine_row16<1>(b, n, kind, lut.a, lut.b, o);
            });
        }
        return;
    }
#endif
    if (s.C == 3) {
        write_rows<3>(src, s, out, [&](const uint8_t* b, int64_t n, int c, uint16_t* o) {
            if (c < 0) lut_row16<3>(b, n, table, wide, o);
            else lut_row16<1>(b, n, table + c * 256, wide + c * 256, o);
        });
    } else {
        write_rows<1>(src, s, out, [&](const uint8_t* b, int64_t n, int, uint16_t* o) {
            lut_row16<1>(b, n, table, wide, o);
        });
    }
}

static void write_lut32(const uint8_t* src, const tbl::WriteSpec& s, const tbl::Lut32& lut, uint32_t* out) {
    const uint32_t* table = lut.table;
#if defined(TBL_HAVE_LUT32_PLANES)
    // Every mapped run is one channel's (CHW, or one channel): the lookup in registers, for any table.
    if (s.chw || s.C == 1) {
        BytePlanes32 planes[3];
        for (int64_t c = 0; c < s.C; ++c) byte_planes32(table + c * 256, planes[c]);
        auto map = [&](const uint8_t* b, int64_t n, int c, uint32_t* o) {
            lut_row32_planes(b, n, planes[c < 0 ? 0 : c], o);
        };
        if (s.C == 3) write_rows<3>(src, s, out, map);
        else write_rows<1>(src, s, out, map);
        return;
    }
#endif
#if defined(TBL_HAVE_AFFINE16)
    if (lut.affine_kind != 0) {
        if (s.C == 3) {
            write_rows<3>(src, s, out, [&](const uint8_t* b, int64_t n, int c, uint32_t* o) {
                if (c < 0) affine_row32<3>(b, n, lut.a, lut.b, o);
                else affine_row32<1>(b, n, lut.a + c, lut.b + c, o);
            });
        } else {
            write_rows<1>(src, s, out, [&](const uint8_t* b, int64_t n, int, uint32_t* o) {
                affine_row32<1>(b, n, lut.a, lut.b, o);
            });
        }
        return;
    }
#endif
    if (s.C == 3) {
        write_rows<3>(src, s, out, [&](const uint8_t* b, int64_t n, int c, uint32_t* o) {
            if (c < 0) lut_row32<3>(b, n, table, o);
            else lut_row32<1>(b, n, table + c * 256, o);
        });
    } else {
        write_rows<1>(src, s, out, [&](const uint8_t* b, int64_t n, int, uint32_t* o) {
            lut_row32<1>(b, n, table, o);
        });
    }
}

static inline uint8_t round_shift_clamp(int32_t acc) {
    // Round half up, then clamp; acc >= 0 because every coefficient is >= 0.
    const int32_t v = (acc + (1 << (tbl::kPrecisionBits - 1))) >> tbl::kPrecisionBits;
    return static_cast<uint8_t>(v > 255 ? 255 : v);
}

#if defined(__AVX2__)
// d[j] = round_shift_clamp(sum_k c[k] * src row k [j]) for j < n, 32 bytes per step.
// Pixels are widened to 16 bits and interleaved in pairs of taps, so one pmaddwd
// forms c[k] * p_k + c[k+1] * p_{k+1} in 32 bits: the same integers as the scalar
// sum (coefficients <= 2**14 and pixels <= 255 fit int16; nothing overflows int32).
static void resample_row_avx2(const uint8_t* src, int64_t stride, const int16_t* c, int64_t taps, int64_t n,
                              uint8_t* __restrict d) {
    const __m256i half = _mm256_set1_epi32(1 << (tbl::kPrecisionBits - 1));
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256i acc[4] = {half, half, half, half};
        for (int64_t k = 0; k < taps; k += 2) {
            const bool pair = k + 1 < taps;
            const uint32_t w_lo = static_cast<uint16_t>(c[k]);
            const uint32_t w_hi = pair ? static_cast<uint32_t>(static_cast<uint16_t>(c[k + 1])) << 16 : 0u;
            const __m256i w = _mm256_set1_epi32(static_cast<int32_t>(w_lo | w_hi));
            const uint8_t* a = src + k * stride + j;
            for (int h = 0; h < 2; ++h) {
                const __m256i pa = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16 * h)));
                const __m256i pb = pair ? _mm256_cvtepu8_epi16(
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + stride + 16 * h)))
                                        : _mm256_setzero_si256();
                // Lanes: unpacklo holds pixels 0-3 | 8-11 of the 16, unpackhi 4-7 | 12-15;
                // packs_epi32 below puts them back in order.
                acc[2 * h] = _mm256_add_epi32(acc[2 * h], _mm256_madd_epi16(_mm256_unpacklo_epi16(pa, pb), w));
                acc[2 * h + 1] = _mm256_add_epi32(acc[2 * h + 1], _mm256_madd_epi16(_mm256_unpackhi_epi16(pa, pb), w));
            }
        }
        const __m256i w0 = _mm256_packs_epi32(_mm256_srai_epi32(acc[0], tbl::kPrecisionBits),
                                              _mm256_srai_epi32(acc[1], tbl::kPrecisionBits));  // pixels 0-15
        const __m256i w1 = _mm256_packs_epi32(_mm256_srai_epi32(acc[2], tbl::kPrecisionBits),
                                              _mm256_srai_epi32(acc[3], tbl::kPrecisionBits));  // 16-31
        // packus clamps to 0..255 (sums are >= 0); its 8-byte groups come out as 0, 16, 8, 24.
        const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(w0, w1), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + j), bytes);
    }
    for (; j < n; ++j) {
        int32_t acc = 0;
        for (int64_t k = 0; k < taps; ++k) acc += c[k] * src[k * stride + j];
        d[j] = round_shift_clamp(acc);
    }
}
#endif

static void resample_rows(const uint8_t* src, int64_t src_stride, const tbl::AxisWeights& w, int64_t row_len,
                          uint8_t* dst, int32_t* __restrict acc) {
    const int64_t taps = w.taps;
    const int64_t rows = static_cast<int64_t>(w.start.size());
    for (int64_t r = 0; r < rows; ++r) {
        const int16_t* c = &w.coef[r * taps];
        const uint8_t* __restrict s0 = src + static_cast<int64_t>(w.start[r]) * src_stride;
        uint8_t* __restrict d = dst + r * row_len;
        const int32_t c0 = c[0];
        if (taps == 1 && c0 == (1 << tbl::kPrecisionBits)) {  // (v * 2**14 + 2**13) >> 14 == v
            std::memcpy(d, s0, static_cast<size_t>(row_len));
            continue;
        }
#if defined(__AVX2__)
        (void)acc;
        resample_row_avx2(s0, src_stride, c, taps, row_len, d);
#else
        if (taps == 1) {
            for (int64_t j = 0; j < row_len; ++j) d[j] = round_shift_clamp(c0 * s0[j]);
            continue;
        }
        const int32_t c1 = c[1];
        const uint8_t* __restrict s1 = s0 + src_stride;
        if (taps == 2) {
            for (int64_t j = 0; j < row_len; ++j) d[j] = round_shift_clamp(c0 * s0[j] + c1 * s1[j]);
            continue;
        }
        if (taps == 3) {
            const int32_t c2 = c[2];
            const uint8_t* __restrict s2 = s1 + src_stride;
            for (int64_t j = 0; j < row_len; ++j)
                d[j] = round_shift_clamp(c0 * s0[j] + c1 * s1[j] + c2 * s2[j]);
            continue;
        }
        for (int64_t j = 0; j < row_len; ++j) acc[j] = c0 * s0[j] + c1 * s1[j];
        for (int64_t k = 2; k < taps; ++k) {
            const int32_t ck = c[k];
            const uint8_t* __restrict sk = s0 + k * src_stride;
            for (int64_t j = 0; j < row_len; ++j) acc[j] += ck * sk[j];
        }
        for (int64_t j = 0; j < row_len; ++j) d[j] = round_shift_clamp(acc[j]);
#endif
    }
}

template <int C>
static void transpose_fixed(const uint8_t* __restrict src, int64_t rows, int64_t cols, uint8_t* __restrict dst) {
    // Blocks of 16 x 16 pixels keep both sides in L1. Three-byte pixels move as
    // four-byte words: the extra byte lands on the next pixel of the same
    // destination row, which is written afterwards. The source read may run one
    // byte past the last pixel, so the source buffer carries one byte of padding.
    constexpr int64_t B = 16;
    for (int64_t r0 = 0; r0 < rows; r0 += B) {
        const int64_t r1 = std::min(rows, r0 + B);
        for (int64_t c0 = 0; c0 < cols; c0 += B) {
            const int64_t c1 = std::min(cols, c0 + B);
            for (int64_t x = c0; x < c1; ++x) {
                uint8_t* d = dst + (x * rows) * C;
                if (C == 3) {
                    // The last pixel of a destination row is copied bytewise: a word
                    // store would touch the next row, whose first block is done.
                    const int64_t word_end = std::min(r1, rows - 1);
                    for (int64_t r = r0; r < word_end; ++r) {
                        uint32_t v;
                        std::memcpy(&v, src + (r * cols + x) * 3, 4);
                        std::memcpy(d + r * 3, &v, 4);
                    }
                    for (int64_t r = word_end; r < r1; ++r)
                        for (int k = 0; k < 3; ++k) d[r * 3 + k] = src[(r * cols + x) * 3 + k];
                } else {
                    for (int64_t r = r0; r < r1; ++r) d[r] = src[r * cols + x];
                }
            }
        }
    }
}

#if defined(__AVX2__)
// 8 x 8 blocks of 3-byte pixels: widen each pixel to a 32-bit lane, transpose the
// 8 x 8 lanes, narrow back. Reads up to 8 bytes past a source row's 8 pixels (the
// source buffer carries that padding); stores never leave the destination block.
static void transpose3_avx2(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst) {
    const __m256i spread = _mm256_setr_epi32(0, 1, 2, 3, 3, 4, 5, 6);
    // After `spread`, each 128-bit lane starts with its four pixels (12 bytes).
    const __m256i widen = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,  //
                                           0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    const __m256i narrow = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,  //
                                            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const int64_t r8 = rows & ~int64_t{7}, c8 = cols & ~int64_t{7};
    for (int64_t r0 = 0; r0 < r8; r0 += 8) {
        for (int64_t c0 = 0; c0 < c8; c0 += 8) {
            __m256i v[8];
            for (int i = 0; i < 8; ++i) {
                const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + ((r0 + i) * cols + c0) * 3));
                v[i] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(raw, spread), widen);
            }
            const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
            const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
            const __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
            const __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
            const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
            const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
            const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
            const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
            __m256i w[8];
            w[0] = _mm256_permute2x128_si256(u0, u4, 0x20), w[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
            w[1] = _mm256_permute2x128_si256(u1, u5, 0x20), w[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
            w[2] = _mm256_permute2x128_si256(u2, u6, 0x20), w[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
            w[3] = _mm256_permute2x128_si256(u3, u7, 0x20), w[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
            for (int i = 0; i < 8; ++i) {
                const __m256i n = _mm256_shuffle_epi8(w[i], narrow);  // 12 bytes at the start of each lane
                uint8_t* d = dst + ((c0 + i) * rows + r0) * 3;
                const __m128i lo = _mm256_castsi256_si128(n), hi = _mm256_extracti128_si256(n, 1);
                _mm_storeu_si128(reinterpret_cast<__m128i*>(d), lo);  // bytes 12..15 are rewritten next
                _mm_storel_epi64(reinterpret_cast<__m128i*>(d + 12), hi);
                const uint32_t last = static_cast<uint32_t>(_mm_extract_epi32(hi, 2));
                std::memcpy(d + 20, &last, 4);
            }
        }
    }
    // Remaining columns of the full row blocks, then the remaining rows.
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = (r < r8 ? c8 : 0); x < cols; ++x)
            for (int k = 0; k < 3; ++k) dst[(x * rows + r) * 3 + k] = src[(r * cols + x) * 3 + k];
}
#endif

// rows x cols pixels -> cols x rows pixels. For C == 3 the source needs
// kTransposePad bytes of readable padding past rows * cols * 3.
static void transpose_pixels(const uint8_t* src, int64_t rows, int64_t cols, int64_t C, uint8_t* dst) {
#if defined(__AVX2__)
    if (C == 3) {
        transpose3_avx2(src, rows, cols, dst);
        return;
    }
#endif
    if (C == 3) transpose_fixed<3>(src, rows, cols, dst);
    else transpose_fixed<1>(src, rows, cols, dst);
}

static const tbl::IsaKernels kKernels = {
    TBL_ISA_NAME, write_u8, write_lut16, write_lut32, resample_rows, transpose_pixels,
#if defined(TBL_HAVE_AFFINE16)
    affine16_matches, affine32_matches,
#else
    nullptr, nullptr,
#endif
#if defined(__AVX2__)
    true,
#else
    false,
#endif
};

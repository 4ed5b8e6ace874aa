// Shared device primitives of the flashprop FlashAttention-2 kernels (sm_80+ instructions,
// built for sm_90a). Plain CUDA: no torch headers, so CI can `nvcc -c` it without torch.
//
// Conventions used by every kernel in this directory:
//   * Tiles live in shared memory as ROWS x kD elements (kD = padded head dim, a multiple of
//     64), stored in 16-byte chunks of 8 elements. Chunk c of row r is placed at chunk
//     c ^ (r & 7) (an XOR swizzle inside each group of 8 chunks), so that the 8 row addresses
//     an ldmatrix phase reads, same logical chunk, 8 consecutive rows, fall in 8 different
//     16-byte bank groups: no bank conflicts, no padding.
//   * Matrix products use mma.sync m16n8k16 (fp16/bf16 inputs, fp32 accumulators). A warp
//     owns 16 * kMT rows of the output (kMT m16 tiles). The fragment layouts (PTX ISA,
//     "Matrix fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//       A (16x16, row-major):  a0 = (g, 2t..2t+1)   a1 = (g+8, 2t..)   a2 = (g, 2t+8..)
//                              a3 = (g+8, 2t+8..)
//       B (16x8, "col"):       b0 = (k 2t..2t+1, n g)   b1 = (k 2t+8.., n g)
//       C (16x8, fp32):        c0, c1 = (g, 2t..2t+1)   c2, c3 = (g+8, 2t..2t+1)
//     The C fragments of two neighbouring n8 tiles are exactly the A fragment of one k16 step,
//     which is how a product computed in registers (P, dS) feeds the next product directly.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashprop {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) == exp2(x * log2(e))
constexpr float kLn2 = 0.6931471805599453f;

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---- element types -------------------------------------------------------------------------

template <typename T>
struct ElemTraits;

template <>
struct ElemTraits<__nv_bfloat16> {
  // Two floats -> one 32-bit register holding (lo, hi) as bf16, round to nearest.
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  // c += a * b for one m16n8k16 tile.
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct ElemTraits<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- shared memory, ldmatrix, cp.async -----------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The swizzled addressing (swz_step) needs 128-byte aligned tiles; dynamic shared memory is
// declared __align__(128), and this traps loudly rather than compute garbage if it ever is not.
__device__ __forceinline__ void check_smem_alignment(const void* smem) {
  if ((smem_addr(smem) & 127u) != 0u) __trap();
}

// Element offset of (row, col) in a swizzled ROWS x kD tile; col must be a multiple of 8.
template <int kD>
__device__ __forceinline__ int swz(int row, int col) {
  static_assert(kD % 64 == 0, "the swizzle needs rows of at least 8 chunks");
  return row * kD + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8;
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i; r[i] receives
// this lane's (row lane/4, cols 2*(lane%4)..+1) of matrix i (transposed with .trans).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte global -> shared copy that bypasses L1; src_bytes = 0 reads nothing and zero-fills
// (how tile tails and padded head-dim columns are loaded without out-of-bounds reads).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Asynchronously copy rows [row0, row0 + ROWS) x cols [0, kD) of a row-major matrix (row
// stride `row_stride` elements, unit column stride, 16-byte aligned rows) into a swizzled
// smem tile. Rows >= n_rows and columns >= n_cols (a multiple of 8) are zero-filled.
template <int ROWS, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* tile, const T* base, int64_t row_stride, int row0,
                                          int n_rows, int n_cols) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int chunk = i * kThreads + threadIdx.x;
    const int r = chunk / kChunksPerRow;
    const int c = (chunk % kChunksPerRow) * 8;
    const bool ok = row0 + r < n_rows && c < n_cols;
    const T* src = ok ? base + (row0 + r) * row_stride + c : base;
    cp_async_16(smem_addr(tile + swz<kD>(r, c)), src, ok ? 16 : 0);
  }
}

// ---- warp-level tile products --------------------------------------------------------------

// Fast addressing of the swizzled tiles inside the warp GEMMs. A lane's ldmatrix row always has
// the same (row & 7) (row offsets are multiples of 8), and its logical chunk is c0 + dc with
// c0 in {0, 1} and dc even, so c0 + dc == c0 ^ dc and the physical chunk is
// ((c0 ^ row) & 7) ^ (dc & 7) | (dc & ~7). Tiles are 128-byte aligned with 128-byte multiples as
// rows, so bits 4..6 of the byte address hold the chunk-in-group: the lane computes its base
// address once (swz_base) and every step is one XOR with a compile-time constant plus an
// immediate offset (swz_step).
template <int kD, typename T>
__device__ __forceinline__ uint32_t swz_base(const T* tile, int row, int c0) {
  return smem_addr(tile) + row * kD * 2 + (((c0 ^ row) & 7) << 4);
}
__device__ __forceinline__ uint32_t swz_step(uint32_t base, int dc) {
  return (base ^ ((dc & 7) << 4)) + ((dc & ~7) << 4);
}

// acc[m][kN/8][4] += A_m * B^T for one warp and its kMT m16 tiles m: A_m = rows
// [a_row0 + 16m, a_row0 + 16m + 16) of smem tile sA (ROWS x kD; a_row0 a multiple of 8),
// B = rows [0, kN) of smem tile sB (kN x kD); contraction over all kD columns. Each B fragment
// loaded is reused by the kMT tiles (kMT = 2 halves the shared-memory traffic per mma). Used for
// S = Q K^T, dP = dO V^T and their transposes K Q^T, V dO^T.
template <int kMT, int kD, int kN, typename T>
__device__ __forceinline__ void warp_gemm_nt(float (*acc)[kN / 8][4], const T* sA, int a_row0,
                                             const T* sB) {
  const int lane = threadIdx.x & 31;
  // ldmatrix x4 matrices: A (rows 0-7 | 8-15) x (k 0-7 | 8-15) in the order a0, a1, a2, a3;
  // B (k 0-7, k 8-15) of n rows 0-7, then of n rows 8-15: b0, b1 of two n8 tiles.
  const uint32_t a_base = swz_base<kD>(sA, a_row0 + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
  const uint32_t b_base = swz_base<kD>(sB, (lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < kD; kk += 16) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int m = 0; m < kMT; ++m) ldmatrix_x4(a[m], swz_step(a_base, kk / 8) + m * 16 * kD * 2);
#pragma unroll
    for (int n = 0; n < kN; n += 16) {
      uint32_t b[4];
      ldmatrix_x4(b, swz_step(b_base, kk / 8) + n * kD * 2);
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        ElemTraits<T>::mma(acc[m][n / 8], a[m], b[0], b[1]);
        ElemTraits<T>::mma(acc[m][n / 8 + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// acc[m][kD/8][4] += P_m * B for one warp and its kMT m16 tiles: P_m (16 x kK) is given as fp32
// C fragments p[m][kK/8][4] (rounded to T here), B = rows [0, kK) of smem tile sB (kK x kD, read
// transposed with ldmatrix.trans). Used for O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.
template <int kMT, int kK, int kD, typename T>
__device__ __forceinline__ void warp_gemm_rn(float (*acc)[kD / 8][4], const float (*p)[kK / 8][4],
                                             const T* sB) {
  const int lane = threadIdx.x & 31;
  // ldmatrix x4.trans matrices: (k rows 0-7, k rows 8-15) of n 0-7, then of n 8-15: b0, b1 of
  // two n8 tiles.
  const uint32_t base = swz_base<kD>(sB, (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
#pragma unroll
  for (int kk = 0; kk < kK; kk += 16) {
    const int j = kk / 8;
    uint32_t a[kMT][4];
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      a[m][0] = ElemTraits<T>::pack(p[m][j][0], p[m][j][1]);
      a[m][1] = ElemTraits<T>::pack(p[m][j][2], p[m][j][3]);
      a[m][2] = ElemTraits<T>::pack(p[m][j + 1][0], p[m][j + 1][1]);
      a[m][3] = ElemTraits<T>::pack(p[m][j + 1][2], p[m][j + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < kD; n += 16) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, swz_step(base, n / 8) + kk * kD * 2);
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        ElemTraits<T>::mma(acc[m][n / 8], a[m], b[0], b[1]);
        ElemTraits<T>::mma(acc[m][n / 8 + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// Sum / max over the 4 lanes (t = 0..3) that share a fragment row.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Store a warp's 16 x kD fp32 accumulator (times `mul`) as T into rows [row0, row0 + 16) of a
// row-major matrix, skipping rows >= n_rows and columns >= n_cols.
template <int kD, typename T>
__device__ __forceinline__ void store_rows(T* base, int64_t row_stride, int row0, int n_rows,
                                           int n_cols, const float (*acc)[4], float mul0,
                                           float mul1) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
    if (row >= n_rows) continue;
    const float mul = h == 0 ? mul0 : mul1;
    T* dst = base + row * row_stride;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      const int col = n * 8 + 2 * t;
      if (col < n_cols) {
        *reinterpret_cast<uint32_t*>(dst + col) =
            ElemTraits<T>::pack(acc[n][2 * h] * mul, acc[n][2 * h + 1] * mul);
      }
    }
  }
}

}  // namespace flashprop

// FlashAttention-2 forward kernel.
//
// One thread block computes kBlockM = 16 * kMT * kWarps query rows of one (batch, query head);
// warp w owns rows [16 kMT w, 16 kMT (w + 1)) of the block. It streams over key tiles of kBlockN
// keys:
//
//   S = Q K_j^T                      (mma, fp32; scaled into the log2 domain: S * scale * log2 e)
//   mask: keys >= Nk, and for causal keys j > i + (Nk - Nq), get S = -inf
//   m_new = max(m, rowmax S);  alpha = exp2(m - m_new);  P = exp2(S - m_new)
//   l = alpha * l + rowsum P;  O = alpha * O + P V_j      (P rounded to the input type)
//
// and finally O /= l, lse = (m + log2 l) * ln 2. A row whose keys are all masked keeps m = -inf;
// it uses 0 in place of m inside the exponentials (exp2(-inf) = 0, never inf - inf), and ends
// with l = 0, written as O = 0 and lse = -inf.
//
// Key tiles run through a two-stage cp.async pipeline: tile j+1 is loaded while tile j is used.
// Under causal masking the block only visits keys j < (last row of the block) + (Nk - Nq) + 1;
// only tiles that cross Nk or the diagonal evaluate the mask.
#pragma once

#include <cmath>

#include "flash_api.h"
#include "flash_common.cuh"

namespace flashprop {

template <int kD, int kWarps, int kMTiles, int kBlockN>
struct FwdConfig {
  static constexpr int kHeadDim = kD;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMT = kMTiles;                // m16 tiles (16 query rows each) per warp
  static constexpr int kBlockM = 16 * kMTiles * kWarps;
  static constexpr int kTileN = kBlockN;
  // sQ, then two stages of sK and sV.
  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * kD * 2;
};

// One key tile's online-softmax step for the kMT m16 tiles of a warp: scale S into log2 units
// (multiply first: right for any finite scale, zero or negative too), mask it when kMask (keys
// >= Nk; causal keys j > i + Nk - Nq), then update the running max and sum, rescale O, and leave
// P = exp2(S - m) in acc_s. Lane-owned rows: (m, r) is query row_w + 16 m + g + 8 r.
template <bool kMask, int kMT, int kBlockN, int kD>
__device__ __forceinline__ void softmax_update(float (*acc_s)[kBlockN / 8][4],
                                               float (*acc_o)[kD / 8][4], float (*row_max)[2],
                                               float (*row_sum)[2], float scale_log2,
                                               const AttnShape& s, int n0, int row_w) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = acc_s[m][n][e] * scale_log2;
        if constexpr (kMask) {
          const int col = n0 + n * 8 + 2 * t + (e & 1);
          const int row = row_w + 16 * m + g + 8 * (e >> 1);
          if (col >= s.nk || (s.causal && col > row + s.nk - s.nq)) x = -INFINITY;
        }
        acc_s[m][n][e] = x;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
        mx = fmaxf(mx, fmaxf(acc_s[m][n][2 * r], acc_s[m][n][2 * r + 1]));
      }
      mx = fmaxf(row_max[m][r], quad_max(mx));
      const float m_use = mx == -INFINITY ? 0.f : mx;  // fully masked so far: avoid inf - inf
      const float alpha = exp2f(row_max[m][r] - m_use);
      row_max[m][r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          acc_s[m][n][e] = exp2f(acc_s[m][n][e] - m_use);
          sum += acc_s[m][n][e];
        }
      }
      row_sum[m][r] = row_sum[m][r] * alpha + sum;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        acc_o[m][n][2 * r] *= alpha;
        acc_o[m][n][2 * r + 1] *= alpha;
      }
    }
  }
}

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) flash_fwd_kernel(const FwdParams p) {
  constexpr int kD = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kTileN;
  constexpr int kThreads = Cfg::kThreads, kMT = Cfg::kMT;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  check_smem_alignment(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBlockM * kD;      // 2 stages
  T* sV = sK + 2 * kBlockN * kD;  // 2 stages

  const AttnShape& s = p.s;
  // Causal: the last query blocks see the most keys; launch them first for a better tail.
  const int m_block = s.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int m0 = m_block * kBlockM, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (s.hq / s.hkv);
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];
  T* o = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
  float* lse = p.lse + (static_cast<int64_t>(b) * s.hq + h) * s.nq;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row_w = m0 + warp * 16 * kMT;  // first query row of this warp
  const int shift = s.nk - s.nq;           // bottom-right causal offset
  const int n_end = s.causal ? min(s.nk, m0 + kBlockM + shift) : s.nk;
  const int n_tiles = n_end > 0 ? ceil_div(n_end, kBlockN) : 0;
  const float scale_log2 = s.scale * kLog2e;

  // Lane-owned rows: (m, r) is query row row_w + 16 m + g + 8 r.
  float acc_o[kMT][kD / 8][4] = {};
  float row_max[kMT][2], row_sum[kMT][2];  // running max (log2 units), this lane's partial sum
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0.f;
  }

  if (n_tiles > 0) {
    load_tile<kBlockM, kD, kThreads>(sQ, q, p.q_stride[2], m0, s.nq, s.d);
    load_tile<kBlockN, kD, kThreads>(sK, k, p.k_stride[2], 0, s.nk, s.d);
    load_tile<kBlockN, kD, kThreads>(sV, v, p.v_stride[2], 0, s.nk, s.d);
    cp_async_commit();
  }

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * kBlockN;
    if (j + 1 < n_tiles) {  // prefetch the next key tile into the other stage
      const int st = (j + 1) & 1;
      load_tile<kBlockN, kD, kThreads>(sK + st * kBlockN * kD, k, p.k_stride[2], n0 + kBlockN,
                                       s.nk, s.d);
      load_tile<kBlockN, kD, kThreads>(sV + st * kBlockN * kD, v, p.v_stride[2], n0 + kBlockN,
                                       s.nk, s.d);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* sKj = sK + (j & 1) * kBlockN * kD;
    const T* sVj = sV + (j & 1) * kBlockN * kD;

    float acc_s[kMT][kBlockN / 8][4] = {};
    warp_gemm_nt<kMT, kD, kBlockN>(acc_s, sQ, row_w - m0, sKj);

    // Only tiles that cross Nk or this warp's part of the causal diagonal evaluate the mask (two
    // instantiations, so the common unmasked path carries no per-element compares).
    if (n0 + kBlockN > s.nk || (s.causal && n0 + kBlockN - 1 > row_w + shift)) {
      softmax_update<true, kMT, kBlockN, kD>(acc_s, acc_o, row_max, row_sum, scale_log2, s, n0, row_w);
    } else {
      softmax_update<false, kMT, kBlockN, kD>(acc_s, acc_o, row_max, row_sum, scale_log2, s, n0,
                                              row_w);
    }

    warp_gemm_rn<kMT, kBlockN, kD>(acc_o, acc_s, sVj);
    __syncthreads();  // the stage read here is overwritten by the next iteration's prefetch
  }

#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(row_sum[m][r]);
      inv[r] = l > 0.f ? 1.f / l : 0.f;
      const int row = row_w + 16 * m + g + 8 * r;
      if (t == 0 && row < s.nq) lse[row] = l > 0.f ? (row_max[m][r] + log2f(l)) * kLn2 : -INFINITY;
    }
    store_rows<kD>(o, p.o_stride[2], row_w + 16 * m, s.nq, s.d, acc_o[m], inv[0], inv[1]);
  }
}

}  // namespace flashprop

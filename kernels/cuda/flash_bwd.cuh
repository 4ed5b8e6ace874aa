// FlashAttention-2 backward kernels. All three are deterministic: no atomics, every output
// element is reduced by exactly one warp in a fixed order.
//
// With S = scale * Q K^T (masked entries -inf), the saved lse, and incoming gradients dO (of O)
// and dlse (of lse):
//
//   P  = exp(S - lse)                         (recomputed tile by tile, never stored)
//   dV = P^T dO                               dP = dO V^T
//   Delta_i = sum_d dO_id O_id - dlse_i       dS = P * (dP - Delta)
//   dQ = scale * dS K                         dK = scale * dS^T Q
//
// (dlse enters through d lse_i / d S_ij = P_ij, which folds into Delta.)
//
//   1. flash_bwd_preprocess_kernel: Delta, and lse2 = lse * log2 e with +inf for rows that see no
//      key, so that P = exp2(S * scale * log2 e - lse2) is exactly 0 there (never NaN).
//   2. flash_bwd_dkdv_kernel: one block per (kBlockN keys, batch, kv head); warp w owns 16 kMT
//      consecutive keys. It computes the transposed products S^T = K Q^T and dP^T = V dO^T so that
//      P^T and dS^T come out in registers as the A operand of dV += P^T dO and dK += dS^T Q, and
//      streams over query tiles of every query head of the kv head's group (GQA sum in
//      registers). For head dims > 128 the dK and dV accumulators do not both fit in registers:
//      the kernel then runs twice, once for dV (kDoK = false) and once for dK (kDoV = false).
//   3. flash_bwd_dq_kernel: one block per (kBlockM queries, batch, query head); warp w owns
//      16 kMT consecutive queries; it recomputes S and dP per key tile and accumulates dQ += dS K.
//
// Tails need no masks here: rows past Nq are loaded as Q = dO = 0 with lse2 = +inf (P = 0), and
// keys past Nk are loaded as K = V = 0, so they add nothing to the stored rows; only the causal
// diagonal (and, in the dQ kernel, the Nk tail for clarity) is masked.
#pragma once

#include <cmath>
#include <type_traits>

#include "flash_api.h"
#include "flash_common.cuh"

namespace flashprop {

// One warp per row: Delta = rowsum(dO * O) - dlse and the log2-domain lse.
template <typename T>
__global__ void flash_bwd_preprocess_kernel(const BwdParams p) {
  const AttnShape& s = p.s;
  const int64_t rows = static_cast<int64_t>(s.batch) * s.hq * s.nq;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int i = static_cast<int>(row % s.nq);
  const int h = static_cast<int>((row / s.nq) % s.hq);
  const int b = static_cast<int>(row / (static_cast<int64_t>(s.nq) * s.hq));
  const T* o = static_cast<const T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + i * p.o_stride[2];
  const T* dout =
      static_cast<const T*>(p.dout) + b * p.do_stride[0] + h * p.do_stride[1] + i * p.do_stride[2];
  float acc = 0.f;
  for (int d = lane; d < s.d; d += 32) {
    acc += ElemTraits<T>::to_float(o[d]) * ElemTraits<T>::to_float(dout[d]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const float l = p.lse[row];
    p.delta[row] = acc - p.dlse[row];
    p.lse2[row] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
}

template <int kD, int kWarps, int kMTiles, int kBlockM, bool kDoK, bool kDoV>
struct DkDvConfig {
  static constexpr int kHeadDim = kD;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMT = kMTiles;                   // m16 tiles (16 keys each) per warp
  static constexpr int kBlockN = 16 * kMTiles * kWarps;  // keys per block
  static constexpr int kTileM = kBlockM;       // queries per step
  static constexpr bool kDK = kDoK, kDV = kDoV;
  // sK, sV (if dK is computed), two stages of sQ and sdO, two stages of lse2 and Delta.
  static constexpr int kSmemBytes =
      ((kDoK ? 2 : 1) * kBlockN + 4 * kBlockM) * kD * 2 + 4 * kBlockM * 4;
};

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) flash_bwd_dkdv_kernel(const BwdParams p) {
  constexpr int kD = Cfg::kHeadDim, kBlockN = Cfg::kBlockN, kBlockM = Cfg::kTileM;
  constexpr int kThreads = Cfg::kThreads, kMT = Cfg::kMT;
  constexpr bool kDoK = Cfg::kDK, kDoV = Cfg::kDV;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  check_smem_alignment(smem_raw);
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kBlockN * kD;                        // only used when kDoK
  T* sQ = sV + (kDoK ? kBlockN * kD : 0);           // 2 stages
  T* sdO = sQ + 2 * kBlockM * kD;                   // 2 stages
  float* sLse2 = reinterpret_cast<float*>(sdO + 2 * kBlockM * kD);  // 2 stages
  float* sDelta = sLse2 + 2 * kBlockM;                               // 2 stages

  const AttnShape& s = p.s;
  const int n0 = blockIdx.x * kBlockN, hk = blockIdx.y, b = blockIdx.z;
  const int group = s.hq / s.hkv;
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int key_w = n0 + warp * 16 * kMT;  // first key of this warp
  const int shift = s.nk - s.nq;
  const float scale_log2 = s.scale * kLog2e;

  // Queries that see any key of this block: i >= n0 - shift (causal), else all.
  const int m_begin = s.causal ? max(0, n0 - shift) : 0;
  const int m_first_tile = m_begin / kBlockM;
  const int m_tiles = m_begin < s.nq ? ceil_div(s.nq, kBlockM) - m_first_tile : 0;
  const int steps = m_tiles * group;  // (query head in group, query tile) pairs

  // Accumulators of this warp's keys: (m, r) is key key_w + 16 m + g + 8 r.
  float acc_dk[kMT][kDoK ? kD / 8 : 1][4] = {};
  float acc_dv[kMT][kDoV ? kD / 8 : 1][4] = {};

  // Issue the loads of step `it` (query head, query tile) into stage `st`.
  auto load_step = [&](int it, int st) {
    const int h = hk * group + it / m_tiles;
    const int m0 = (m_first_tile + it % m_tiles) * kBlockM;
    const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const T* dout = static_cast<const T*>(p.dout) + b * p.do_stride[0] + h * p.do_stride[1];
    load_tile<kBlockM, kD, kThreads>(sQ + st * kBlockM * kD, q, p.q_stride[2], m0, s.nq, s.d);
    load_tile<kBlockM, kD, kThreads>(sdO + st * kBlockM * kD, dout, p.do_stride[2], m0, s.nq, s.d);
    const int64_t row_base = (static_cast<int64_t>(b) * s.hq + h) * s.nq;
    for (int i = threadIdx.x; i < kBlockM; i += kThreads) {
      const bool ok = m0 + i < s.nq;
      sLse2[st * kBlockM + i] = ok ? p.lse2[row_base + m0 + i] : INFINITY;
      sDelta[st * kBlockM + i] = ok ? p.delta[row_base + m0 + i] : 0.f;
    }
  };

  if (steps > 0) {
    load_tile<kBlockN, kD, kThreads>(sK, k, p.k_stride[2], n0, s.nk, s.d);
    if (kDoK) load_tile<kBlockN, kD, kThreads>(sV, v, p.v_stride[2], n0, s.nk, s.d);
    load_step(0, 0);
    cp_async_commit();
  }

  for (int it = 0; it < steps; ++it) {
    if (it + 1 < steps) {
      load_step(it + 1, (it + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int st = it & 1;
    const T* sQi = sQ + st * kBlockM * kD;
    const T* sdOi = sdO + st * kBlockM * kD;
    const float* lse2 = sLse2 + st * kBlockM;
    const float* delta = sDelta + st * kBlockM;
    const int m0 = (m_first_tile + it % m_tiles) * kBlockM;

    // P^T = exp2(K Q^T * scale * log2 e - lse2[query]), rows = this warp's keys.
    float acc_p[kMT][kBlockM / 8][4] = {};
    warp_gemm_nt<kMT, kD, kBlockM>(acc_p, sK, key_w - n0, sQi);
    // Causal: key j is visible to query i iff i >= j - shift; the tile needs the mask iff its
    // first query is below the threshold of this warp's last key.
    // Two instantiations (kMask), so the common unmasked path carries no per-element compares.
    auto probabilities = [&](auto mask_tag) {
      constexpr bool kMask = decltype(mask_tag)::value;
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
#pragma unroll
        for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n * 8 + 2 * t + (e & 1);
            float pv = exp2f(acc_p[m][n][e] * scale_log2 - lse2[col]);
            if (kMask && m0 + col < key_w + 16 * m + g + 8 * (e >> 1) - shift) pv = 0.f;
            acc_p[m][n][e] = pv;
          }
        }
      }
    };
    if (s.causal && m0 < key_w + 16 * kMT - 1 - shift) {
      probabilities(std::true_type{});
    } else {
      probabilities(std::false_type{});
    }
    if constexpr (kDoV) warp_gemm_rn<kMT, kBlockM, kD>(acc_dv, acc_p, sdOi);

    if constexpr (kDoK) {
      // dS^T = P^T * (dP^T - Delta[query]) with dP^T = V dO^T.
      float acc_dp[kMT][kBlockM / 8][4] = {};
      warp_gemm_nt<kMT, kD, kBlockM>(acc_dp, sV, key_w - n0, sdOi);
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
#pragma unroll
        for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc_dp[m][n][e] = acc_p[m][n][e] * (acc_dp[m][n][e] - delta[n * 8 + 2 * t + (e & 1)]);
          }
        }
      }
      warp_gemm_rn<kMT, kBlockM, kD>(acc_dk, acc_dp, sQi);
    }
    __syncthreads();  // the stage read here is overwritten by the next iteration's prefetch
  }

  if constexpr (kDoK) {
    T* dk = static_cast<T*>(p.dk) + b * p.dk_stride[0] + hk * p.dk_stride[1];
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      store_rows<kD>(dk, p.dk_stride[2], key_w + 16 * m, s.nk, s.d, acc_dk[m], s.scale, s.scale);
    }
  }
  if constexpr (kDoV) {
    T* dv = static_cast<T*>(p.dv) + b * p.dv_stride[0] + hk * p.dv_stride[1];
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      store_rows<kD>(dv, p.dv_stride[2], key_w + 16 * m, s.nk, s.d, acc_dv[m], 1.f, 1.f);
    }
  }
}

template <int kD, int kWarps, int kMTiles, int kBlockN>
struct DqConfig {
  static constexpr int kHeadDim = kD;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMT = kMTiles;                   // m16 tiles (16 queries each) per warp
  static constexpr int kBlockM = 16 * kMTiles * kWarps;  // queries per block
  static constexpr int kTileN = kBlockN;       // keys per step
  // sQ, sdO, then two stages of sK and sV.
  static constexpr int kSmemBytes = (2 * kBlockM + 4 * kBlockN) * kD * 2;
};

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) flash_bwd_dq_kernel(const BwdParams p) {
  constexpr int kD = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kTileN;
  constexpr int kThreads = Cfg::kThreads, kMT = Cfg::kMT;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  check_smem_alignment(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + kBlockM * kD;
  T* sK = sdO + kBlockM * kD;     // 2 stages
  T* sV = sK + 2 * kBlockN * kD;  // 2 stages

  const AttnShape& s = p.s;
  // Causal: the last query blocks see the most keys; launch them first for a better tail.
  const int m_block = s.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int m0 = m_block * kBlockM, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (s.hq / s.hkv);
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
  const T* dout = static_cast<const T*>(p.dout) + b * p.do_stride[0] + h * p.do_stride[1];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];
  T* dq = static_cast<T*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[1];
  const int64_t row_base = (static_cast<int64_t>(b) * s.hq + h) * s.nq;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row_w = m0 + warp * 16 * kMT;  // first query of this warp
  const int shift = s.nk - s.nq;
  const int n_end = s.causal ? min(s.nk, m0 + kBlockM + shift) : s.nk;
  const int n_tiles = n_end > 0 ? ceil_div(n_end, kBlockN) : 0;
  const float scale_log2 = s.scale * kLog2e;

  // Lane-owned rows: (m, r) is query row_w + 16 m + g + 8 r.
  float lse2[kMT][2], delta[kMT][2];
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row_w + 16 * m + g + 8 * r;
      lse2[m][r] = row < s.nq ? p.lse2[row_base + row] : INFINITY;
      delta[m][r] = row < s.nq ? p.delta[row_base + row] : 0.f;
    }
  }

  float acc_dq[kMT][kD / 8][4] = {};

  if (n_tiles > 0) {
    load_tile<kBlockM, kD, kThreads>(sQ, q, p.q_stride[2], m0, s.nq, s.d);
    load_tile<kBlockM, kD, kThreads>(sdO, dout, p.do_stride[2], m0, s.nq, s.d);
    load_tile<kBlockN, kD, kThreads>(sK, k, p.k_stride[2], 0, s.nk, s.d);
    load_tile<kBlockN, kD, kThreads>(sV, v, p.v_stride[2], 0, s.nk, s.d);
    cp_async_commit();
  }

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * kBlockN;
    if (j + 1 < n_tiles) {
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

    float acc_p[kMT][kBlockN / 8][4] = {}, acc_dp[kMT][kBlockN / 8][4] = {};
    warp_gemm_nt<kMT, kD, kBlockN>(acc_p, sQ, row_w - m0, sKj);
    warp_gemm_nt<kMT, kD, kBlockN>(acc_dp, sdO, row_w - m0, sVj);

    // dS = P * (dP - Delta), in acc_p; two instantiations as in the forward (kMask).
    auto grad_scores = [&](auto mask_tag) {
      constexpr bool kMask = decltype(mask_tag)::value;
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
#pragma unroll
        for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            float pv = exp2f(acc_p[m][n][e] * scale_log2 - lse2[m][r]);
            if constexpr (kMask) {
              const int col = n0 + n * 8 + 2 * t + (e & 1);
              if (col >= s.nk || (s.causal && col > row_w + 16 * m + g + 8 * r + shift)) pv = 0.f;
            }
            acc_p[m][n][e] = pv * (acc_dp[m][n][e] - delta[m][r]);
          }
        }
      }
    };
    if (n0 + kBlockN > s.nk || (s.causal && n0 + kBlockN - 1 > row_w + shift)) {
      grad_scores(std::true_type{});
    } else {
      grad_scores(std::false_type{});
    }
    warp_gemm_rn<kMT, kBlockN, kD>(acc_dq, acc_p, sKj);
    __syncthreads();
  }
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    store_rows<kD>(dq, p.dq_stride[2], row_w + 16 * m, s.nq, s.d, acc_dq[m], s.scale, s.scale);
  }
}

}  // namespace flashprop

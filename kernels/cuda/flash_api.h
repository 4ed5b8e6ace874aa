// Host-side interface of the flashprop FlashAttention-2 CUDA kernels: plain pointers, strides
// and sizes (no torch), implemented in flash_kernels.cu and called by flash_binding.cpp.
//
// Layout: q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, D); every tensor is addressed as
// base + b * stride[0] + h * stride[1] + n * stride[2] + d with unit last-dim stride, strides in
// elements, multiples of 8 (16 bytes), and 16-byte aligned base pointers. Query head h reads kv
// head h / (Hq / Hkv). lse / delta / lse2 buffers are contiguous float32 (B, Hq, Nq).
// Causal masking is bottom-right aligned: query i sees key j iff j <= i + (Nk - Nq).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashprop {

struct AttnShape {
  int batch, hq, hkv, nq, nk, d;  // d == Dv, a multiple of 8 in [8, 256]
  float scale;                     // softmax scale applied to q . k
  bool causal;
  bool bf16;  // element type: bfloat16 if true, float16 otherwise
};

struct FwdParams {
  AttnShape s;
  const void *q, *k, *v;
  void* o;     // (B, Hq, Nq, D), strides o_stride
  float* lse;  // (B, Hq, Nq) natural-log logsumexp; -inf for rows that see no key
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
};

struct BwdParams {
  AttnShape s;
  const void *q, *k, *v, *o, *dout;
  const float* lse;   // forward lse (B, Hq, Nq)
  const float* dlse;  // incoming gradient of lse (B, Hq, Nq), contiguous
  void *dq, *dk, *dv;
  float* delta;  // workspace (B, Hq, Nq): rowsum(dO * O) - dlse
  float* lse2;   // workspace (B, Hq, Nq): lse * log2(e), +inf for rows that see no key
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3], do_stride[3];
  int64_t dq_stride[3], dk_stride[3], dv_stride[3];
};

// Launch on `stream`; return cudaErrorInvalidValue for an unsupported head dim, else the
// launch status.
cudaError_t flash_fwd(const FwdParams& p, cudaStream_t stream);
cudaError_t flash_bwd(const BwdParams& p, cudaStream_t stream);

}  // namespace flashprop

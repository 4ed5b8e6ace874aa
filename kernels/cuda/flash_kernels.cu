// Tile configurations, template instantiations and launchers of the flashprop FlashAttention-2
// kernels. Plain CUDA (no torch): `nvcc -c` builds it alone (see ci/compile-cuda).
//
// Head dims are padded up to 64, 128 or 256 inside shared memory (padded columns are
// zero-filled by the loads and never stored), so every D that is a multiple of 8 up to 256 runs.
#include "flash_api.h"
#include "flash_bwd.cuh"
#include "flash_fwd.cuh"

#include <type_traits>

// Build flags so tile shapes can be compared in one session (FLASHPROP_CUDA_FLAGS in
// kernels/cuda_attention.py). Keys per tile of the 64 < d <= 128 forward: 64 (a few bytes of
// register spills) or 32 (none).
#ifndef FLASHPROP_FWD128_BLOCK_N
#define FLASHPROP_FWD128_BLOCK_N 64
#endif
// dQ kernel for 64 < d <= 128: 2 m16 tiles per warp (4 warps, 32-key steps; B fragments reused)
// or 1 (8 warps, 64-key steps).
#ifndef FLASHPROP_DQ128_MT
#define FLASHPROP_DQ128_MT 2
#endif

namespace flashprop {
namespace {

template <typename Kernel, typename Params>
cudaError_t launch(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
                   const Params& p) {
  if (smem_bytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, threads, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, typename Cfg>
cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  const dim3 grid(ceil_div(p.s.nq, Cfg::kBlockM), p.s.hq, p.s.batch);
  return launch(flash_fwd_kernel<T, Cfg>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, p);
}

template <typename T, typename Cfg>
cudaError_t run_dkdv(const BwdParams& p, cudaStream_t stream) {
  const dim3 grid(ceil_div(p.s.nk, Cfg::kBlockN), p.s.hkv, p.s.batch);
  return launch(flash_bwd_dkdv_kernel<T, Cfg>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, p);
}

template <typename T, typename Cfg>
cudaError_t run_dq(const BwdParams& p, cudaStream_t stream) {
  const dim3 grid(ceil_div(p.s.nq, Cfg::kBlockM), p.s.hq, p.s.batch);
  return launch(flash_bwd_dq_kernel<T, Cfg>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, p);
}

// Tile shapes per padded head dim: FwdConfig<kD, warps, m16 tiles per warp, keys per tile>,
// DkDvConfig<kD, warps, m16 tiles per warp, queries per step, dK, dV>,
// DqConfig<kD, warps, m16 tiles per warp, keys per tile>.
template <typename T>
cudaError_t fwd_dispatch(const FwdParams& p, cudaStream_t stream) {
  if (p.s.d <= 64) return run_fwd<T, FwdConfig<64, 4, 2, 64>>(p, stream);
  if (p.s.d <= 128) return run_fwd<T, FwdConfig<128, 4, 2, FLASHPROP_FWD128_BLOCK_N>>(p, stream);
  if (p.s.d <= 256) return run_fwd<T, FwdConfig<256, 4, 1, 32>>(p, stream);
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t bwd_dispatch(const BwdParams& p, cudaStream_t stream) {
  if (p.s.d > 256) return cudaErrorInvalidValue;
  const int64_t rows = static_cast<int64_t>(p.s.batch) * p.s.hq * p.s.nq;
  constexpr int kRowsPerBlock = 8;  // one warp per row
  flash_bwd_preprocess_kernel<T>
      <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0,
         stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (p.s.d <= 64) {
    err = run_dkdv<T, DkDvConfig<64, 4, 2, 32, true, true>>(p, stream);
    if (err == cudaSuccess) err = run_dq<T, DqConfig<64, 4, 2, 32>>(p, stream);
  } else if (p.s.d <= 128) {
    err = run_dkdv<T, DkDvConfig<128, 8, 1, 64, true, true>>(p, stream);
    using Dq128 = std::conditional_t<FLASHPROP_DQ128_MT == 2, DqConfig<128, 4, 2, 32>,
                                     DqConfig<128, 8, 1, 64>>;
    if (err == cudaSuccess) err = run_dq<T, Dq128>(p, stream);
  } else {
    err = run_dkdv<T, DkDvConfig<256, 4, 1, 16, true, false>>(p, stream);
    if (err == cudaSuccess) err = run_dkdv<T, DkDvConfig<256, 4, 1, 32, false, true>>(p, stream);
    if (err == cudaSuccess) err = run_dq<T, DqConfig<256, 4, 1, 32>>(p, stream);
  }
  return err;
}

}  // namespace

cudaError_t flash_fwd(const FwdParams& p, cudaStream_t stream) {
  return p.s.bf16 ? fwd_dispatch<__nv_bfloat16>(p, stream) : fwd_dispatch<__half>(p, stream);
}

cudaError_t flash_bwd(const BwdParams& p, cudaStream_t stream) {
  return p.s.bf16 ? bwd_dispatch<__nv_bfloat16>(p, stream) : bwd_dispatch<__half>(p, stream);
}

}  // namespace flashprop

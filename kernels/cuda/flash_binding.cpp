// PyTorch binding of the flashprop FlashAttention-2 kernels (built by kernels/cuda_attention.py
// with torch.utils.cpp_extension.load). It validates inputs, brings each tensor into the form the
// kernels address (see flash_api.h), allocates outputs and launches on the current stream. The
// autograd and fake-tensor registration of the custom ops lives in the Python loader.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdint>
#include <tuple>

#include "flash_api.h"

namespace {

constexpr int64_t kMaxGridDim = 65535;  // batch and heads index grid.z / grid.y

// The kernels read 16-byte chunks: they need a unit last-dim stride, strides that are multiples
// of 8 elements and a 16-byte aligned base. Any other view is copied to a contiguous tensor.
at::Tensor kernel_ready(const at::Tensor& t) {
  bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int i = 0; i < 3; ++i) ok = ok && (t.size(i) == 1 || t.stride(i) % 8 == 0);
  return ok ? t : t.clone(at::MemoryFormat::Contiguous);
}

// (batch, head, sequence) strides in elements; a size-1 dimension's stride is never used.
void strides_of(const at::Tensor& t, int64_t out[3]) {
  for (int i = 0; i < 3; ++i) out[i] = t.size(i) == 1 ? 0 : t.stride(i);
}

flashprop::AttnShape check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  bool causal, double scale) {
  TORCH_CHECK_TYPE(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                   "flashprop cuda: dtype ", q.scalar_type(), " not supported (float16, bfloat16)");
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                   "flashprop cuda: q, k, v must share one dtype");
  TORCH_CHECK_NOT_IMPLEMENTED(q.is_cuda() && k.is_cuda() && v.is_cuda(),
                              "flashprop cuda: only CUDA tensors are supported");
  TORCH_CHECK_VALUE(q.device() == k.device() && q.device() == v.device(),
                    "flashprop cuda: q, k, v must be on one device");
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                    "flashprop cuda: q, k, v must be 4-d (B, H, N, D)");
  const int64_t b = q.size(0), hq = q.size(1), nq = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), nk = k.size(2);
  TORCH_CHECK_VALUE(k.size(0) == b && v.size(0) == b && v.size(1) == hkv && v.size(2) == nk,
                    "flashprop cuda: incompatible shapes q ", q.sizes(), ", k ", k.sizes(),
                    ", v ", v.sizes());
  TORCH_CHECK_VALUE(k.size(3) == d, "flashprop cuda: k head dim ", k.size(3), " != q head dim ", d);
  TORCH_CHECK_NOT_IMPLEMENTED(v.size(3) == d, "flashprop cuda: value head dim Dv=", v.size(3),
                              " != D=", d, " not supported");
  TORCH_CHECK_NOT_IMPLEMENTED(d % 8 == 0 && d >= 8 && d <= 256, "flashprop cuda: head dim D=", d,
                              " not supported (multiples of 8 up to 256)");
  TORCH_CHECK_VALUE(b >= 1 && hq >= 1 && hkv >= 1 && nq >= 1 && nk >= 1,
                    "flashprop cuda: empty dimension in q ", q.sizes(), " / k ", k.sizes());
  TORCH_CHECK_VALUE(hq % hkv == 0, "flashprop cuda: Hq=", hq, " is not a multiple of Hkv=", hkv);
  TORCH_CHECK_NOT_IMPLEMENTED(b <= kMaxGridDim && hq <= kMaxGridDim,
                              "flashprop cuda: batch and head counts above 65535 not supported");
  TORCH_CHECK_NOT_IMPLEMENTED(nq < (int64_t{1} << 30) && nk < (int64_t{1} << 30),
                              "flashprop cuda: sequence length >= 2^30 not supported");
  flashprop::AttnShape s{};
  s.batch = static_cast<int>(b);
  s.hq = static_cast<int>(hq);
  s.hkv = static_cast<int>(hkv);
  s.nq = static_cast<int>(nq);
  s.nk = static_cast<int>(nk);
  s.d = static_cast<int>(d);
  s.scale = static_cast<float>(scale);
  s.causal = causal;
  s.bf16 = q.scalar_type() == at::kBFloat16;
  return s;
}

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q_in, const at::Tensor& k_in,
                                       const at::Tensor& v_in, bool causal, double scale) {
  const flashprop::AttnShape s = check_inputs(q_in, k_in, v_in, causal, scale);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = kernel_ready(q_in), k = kernel_ready(k_in), v = kernel_ready(v_in);
  at::Tensor o = at::empty({s.batch, s.hq, s.nq, s.d}, q.options());
  at::Tensor lse = at::empty({s.batch, s.hq, s.nq}, q.options().dtype(at::kFloat));

  flashprop::FwdParams p{};
  p.s = s;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  p.lse = lse.data_ptr<float>();
  strides_of(q, p.q_stride);
  strides_of(k, p.k_stride);
  strides_of(v, p.v_stride);
  strides_of(o, p.o_stride);
  const cudaError_t err = flashprop::flash_fwd(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flashprop cuda forward failed: ", cudaGetErrorString(err));
  return {o, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout_in,
                                                   const at::Tensor& q_in,
                                                   const at::Tensor& k_in,
                                                   const at::Tensor& v_in,
                                                   const at::Tensor& o_in,
                                                   const at::Tensor& lse_in,
                                                   const at::Tensor& dlse_in, bool causal,
                                                   double scale) {
  const flashprop::AttnShape s = check_inputs(q_in, k_in, v_in, causal, scale);
  TORCH_CHECK_VALUE(dout_in.sizes() == q_in.sizes() && o_in.sizes() == q_in.sizes(),
                    "flashprop cuda backward: dO and O must have q's shape");
  TORCH_CHECK_TYPE(dout_in.scalar_type() == q_in.scalar_type() &&
                       o_in.scalar_type() == q_in.scalar_type(),
                   "flashprop cuda backward: dO and O must have q's dtype");
  const std::vector<int64_t> lse_shape{s.batch, s.hq, s.nq};
  TORCH_CHECK_VALUE(lse_in.sizes() == at::IntArrayRef(lse_shape) &&
                        dlse_in.sizes() == at::IntArrayRef(lse_shape),
                    "flashprop cuda backward: lse and dlse must be (B, Hq, Nq)");
  TORCH_CHECK_TYPE(lse_in.scalar_type() == at::kFloat && dlse_in.scalar_type() == at::kFloat,
                   "flashprop cuda backward: lse and dlse must be float32");
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = kernel_ready(q_in), k = kernel_ready(k_in), v = kernel_ready(v_in);
  const at::Tensor o = kernel_ready(o_in), dout = kernel_ready(dout_in);
  const at::Tensor lse = lse_in.contiguous(), dlse = dlse_in.contiguous();
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  at::Tensor delta = at::empty(lse_shape, lse.options());
  at::Tensor lse2 = at::empty(lse_shape, lse.options());

  flashprop::BwdParams p{};
  p.s = s;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.dlse = dlse.data_ptr<float>();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.delta = delta.data_ptr<float>();
  p.lse2 = lse2.data_ptr<float>();
  strides_of(q, p.q_stride);
  strides_of(k, p.k_stride);
  strides_of(v, p.v_stride);
  strides_of(o, p.o_stride);
  strides_of(dout, p.do_stride);
  strides_of(dq, p.dq_stride);
  strides_of(dk, p.dk_stride);
  strides_of(dv, p.dv_stride);
  const cudaError_t err = flashprop::flash_bwd(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flashprop cuda backward failed: ", cudaGetErrorString(err));
  return {dq, dk, dv};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flashprop FlashAttention-2 CUDA kernels (forward, backward)";
  m.def("fwd", &fwd, "attention forward: (q, k, v, causal, scale) -> (o, lse)");
  m.def("bwd", &bwd,
        "attention backward: (dO, q, k, v, o, lse, dlse, causal, scale) -> (dq, dk, dv)");
}

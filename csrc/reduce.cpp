// CPU reduction kernels: dst += src over contiguous tensors of the same dtype and size.
// The executor (executor.cpp) calls these after a receive completes; Python validates the inputs
// first, these checks only guard the C++ boundary.
#include <torch/extension.h>

#include <cstdint>

namespace stragglerkit {

namespace {

template <typename T>
void add_inplace(T* __restrict__ dst, const T* __restrict__ src, int64_t count) {
  // Plain loop over restrict pointers: the compiler vectorises it (-O3).
  for (int64_t i = 0; i < count; ++i) {
    dst[i] += src[i];
  }
}

}  // namespace

void reduce_add_(torch::Tensor& dst, const torch::Tensor& src) {
  TORCH_CHECK(dst.device().is_cpu() && src.device().is_cpu(), "reduce_add_: CPU tensors expected");
  TORCH_CHECK(dst.is_contiguous() && src.is_contiguous(), "reduce_add_: tensors must be contiguous");
  TORCH_CHECK(dst.scalar_type() == src.scalar_type(), "reduce_add_: dtype mismatch: ", dst.scalar_type(),
              " vs ", src.scalar_type());
  TORCH_CHECK(dst.numel() == src.numel(), "reduce_add_: size mismatch: ", dst.numel(), " vs ", src.numel());
  const int64_t count = dst.numel();
  switch (dst.scalar_type()) {
    case at::kFloat:
      add_inplace(dst.data_ptr<float>(), src.data_ptr<float>(), count);
      break;
    case at::kDouble:
      add_inplace(dst.data_ptr<double>(), src.data_ptr<double>(), count);
      break;
    case at::kInt:
      add_inplace(dst.data_ptr<int32_t>(), src.data_ptr<int32_t>(), count);
      break;
    case at::kLong:
      add_inplace(dst.data_ptr<int64_t>(), src.data_ptr<int64_t>(), count);
      break;
    default:
      // bfloat16 / float16: ATen's kernel rounds once per element, same as NCCL/gloo.
      dst.add_(src);
  }
}

}  // namespace stragglerkit

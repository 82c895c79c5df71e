// Reduction kernels: dst += src over `count` contiguous elements of one dtype.
//
// The executor (executor.cpp) calls reduce_add_span after a receive completes. On CPU the float and
// integer loops run over restrict pointers, which the compiler vectorises at -O3; half types
// (bfloat16, float16) convert each element to float, add and round once, exactly like ATen's add.
// An averaging plan's final reductions also divide (dst = (dst + src) / n), so the average costs no
// pass of its own: the sum is rounded to the dtype first and then divided (half types: in float,
// rounded once more), which is bit for bit the sum followed by ATen's `div_(n)` on CPU.
// On CUDA the work goes to the kernel in reduce_cuda.cu, launched on the current stream, which is
// the stream the receive's wait() synchronised (NCCL), so the reduction is ordered after the data.
#include "executor.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#ifdef STRAGGLERKIT_CUDA
#include <c10/cuda/CUDAStream.h>
extern "C" int stragglerkit_cuda_reduce_add(void* dst, const void* src, int64_t count, int dtype_code, void* stream);
#endif

namespace stragglerkit {

namespace {

template <typename T>
void add_inplace(T* __restrict__ dst, const T* __restrict__ src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    dst[i] += src[i];
  }
}

template <typename Half>
void add_inplace_half(Half* __restrict__ dst, const Half* __restrict__ src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = static_cast<Half>(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
  }
}

template <typename T>
void add_divide_inplace(T* __restrict__ dst, const T* __restrict__ src, int64_t count, T divisor) {
  for (int64_t i = 0; i < count; ++i) {
    const T sum = dst[i] + src[i];
    dst[i] = sum / divisor;
  }
}

template <typename Half>
void add_divide_inplace_half(Half* __restrict__ dst, const Half* __restrict__ src, int64_t count, float divisor) {
  for (int64_t i = 0; i < count; ++i) {
    const Half sum = static_cast<Half>(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
    dst[i] = static_cast<Half>(static_cast<float>(sum) / divisor);
  }
}

void reduce_add_divide_cpu(void* dst, const void* src, int64_t count, c10::ScalarType dtype, int64_t divisor) {
  switch (dtype) {
    case at::kFloat:
      add_divide_inplace(static_cast<float*>(dst), static_cast<const float*>(src), count, static_cast<float>(divisor));
      break;
    case at::kDouble:
      add_divide_inplace(static_cast<double*>(dst), static_cast<const double*>(src), count,
                         static_cast<double>(divisor));
      break;
    case at::kBFloat16:
      add_divide_inplace_half(static_cast<c10::BFloat16*>(dst), static_cast<const c10::BFloat16*>(src), count,
                              static_cast<float>(divisor));
      break;
    case at::kHalf:
      add_divide_inplace_half(static_cast<c10::Half*>(dst), static_cast<const c10::Half*>(src), count,
                              static_cast<float>(divisor));
      break;
    default:
      TORCH_CHECK(false, "stragglerkit: an averaging reduction needs a floating dtype, got ", dtype,
                  "; use op='sum' and divide");
  }
}

void reduce_add_cpu(void* dst, const void* src, int64_t count, c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      add_inplace(static_cast<float*>(dst), static_cast<const float*>(src), count);
      break;
    case at::kDouble:
      add_inplace(static_cast<double*>(dst), static_cast<const double*>(src), count);
      break;
    case at::kInt:
      add_inplace(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count);
      break;
    case at::kLong:
      add_inplace(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count);
      break;
    case at::kBFloat16:
      add_inplace_half(static_cast<c10::BFloat16*>(dst), static_cast<const c10::BFloat16*>(src), count);
      break;
    case at::kHalf:
      add_inplace_half(static_cast<c10::Half*>(dst), static_cast<const c10::Half*>(src), count);
      break;
    default:
      TORCH_CHECK(false, "stragglerkit: no reduction for dtype ", dtype,
                  "; supported: float32, float64, bfloat16, float16, int32, int64");
  }
}

#ifdef STRAGGLERKIT_CUDA
int cuda_dtype_code(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return 0;
    case at::kDouble: return 1;
    case at::kHalf: return 2;
    case at::kBFloat16: return 3;
    case at::kInt: return 4;
    case at::kLong: return 5;
    default: return -1;
  }
}
#endif

}  // namespace

void reduce_add_span(void* dst, const void* src, int64_t count, c10::ScalarType dtype, const c10::Device& device,
                     int64_t divisor) {
  if (count == 0) {
    return;
  }
  TORCH_CHECK(divisor >= 0, "stragglerkit: negative divisor ", divisor, " in a plan's reduction");
  if (device.is_cpu()) {
    if (divisor > 0) {
      reduce_add_divide_cpu(dst, src, count, dtype, divisor);
    } else {
      reduce_add_cpu(dst, src, count, dtype);
    }
    return;
  }
  // The runtime fuses the division on CPU only (runtime/runtime.py, runtime/plan.py's divide_by):
  // CUDA divides after the run.
  TORCH_CHECK(divisor == 0, "stragglerkit: a fused averaging reduction runs on CPU only, got device ", device);
#ifdef STRAGGLERKIT_CUDA
  if (device.is_cuda()) {
    const int code = cuda_dtype_code(dtype);
    TORCH_CHECK(code >= 0, "stragglerkit: no CUDA reduction for dtype ", dtype);
    void* stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    const int err = stragglerkit_cuda_reduce_add(dst, src, count, code, stream);
    TORCH_CHECK(err == 0, "stragglerkit: CUDA reduction kernel launch failed (cudaError ", err, ")");
    return;
  }
#endif
  TORCH_CHECK(false, "stragglerkit: no reduction for device ", device,
              " in this build (CUDA tensors need stragglerkit built against a CUDA torch)");
}

void reduce_add_(torch::Tensor& dst, const torch::Tensor& src, int64_t divisor) {
  TORCH_CHECK(dst.device() == src.device(), "reduce_add_: tensors on different devices");
  TORCH_CHECK(dst.is_contiguous() && src.is_contiguous(), "reduce_add_: tensors must be contiguous");
  TORCH_CHECK(dst.scalar_type() == src.scalar_type(), "reduce_add_: dtype mismatch: ", dst.scalar_type(),
              " vs ", src.scalar_type());
  TORCH_CHECK(dst.numel() == src.numel(), "reduce_add_: size mismatch: ", dst.numel(), " vs ", src.numel());
  reduce_add_span(dst.data_ptr(), src.data_ptr(), dst.numel(), dst.scalar_type(), dst.device(), divisor);
}

}  // namespace stragglerkit

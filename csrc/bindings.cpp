// The one file that registers stragglerkit._C.
#include <torch/extension.h>

namespace stragglerkit {
void reduce_add_(torch::Tensor& dst, const torch::Tensor& src);
}  // namespace stragglerkit

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "stragglerkit native core: plan executor and reductions";
  m.def("reduce_add_", &stragglerkit::reduce_add_, "dst += src (contiguous CPU tensors, same dtype and size)");
}

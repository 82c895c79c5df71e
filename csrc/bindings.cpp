// The one file that registers stragglerkit._C.
#include <torch/extension.h>

namespace stragglerkit {
void reduce_add_(torch::Tensor& dst, const torch::Tensor& src);
}  // namespace stragglerkit

// ---- simulator (csrc/sim_core.cpp, used by stragglerkit/sim/graph.py) ----
namespace stragglerkit {
pybind11::tuple sim_extract_ops(const pybind11::list& ranks, const pybind11::tuple& kinds);
}  // namespace stragglerkit
// ---- end simulator ----

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "stragglerkit native core: plan executor and reductions";
  m.def("reduce_add_", &stragglerkit::reduce_add_, "dst += src (contiguous CPU tensors, same dtype and size)");
  // ---- simulator ----
  m.def("sim_extract_ops", &stragglerkit::sim_extract_ops, "flatten a Schedule's op lists into int64 arrays");
  // ---- end simulator ----
}

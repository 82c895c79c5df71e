// The one file that registers stragglerkit._C.
#include <torch/extension.h>

namespace stragglerkit {
void reduce_add_(torch::Tensor& dst, const torch::Tensor& src);
}  // namespace stragglerkit

// ---- simulator (csrc/sim_core.cpp, used by stragglerkit/sim/graph.py) ----
namespace stragglerkit {
void register_simulator(pybind11::module_& m);
}  // namespace stragglerkit
// ---- end simulator ----

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "stragglerkit native core: plan executor and reductions";
  m.def("reduce_add_", &stragglerkit::reduce_add_, "dst += src (contiguous CPU tensors, same dtype and size)");
  stragglerkit::register_simulator(m);  // simulator: sim_extract_ops, sim_build_edges
}

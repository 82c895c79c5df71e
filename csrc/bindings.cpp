// The one file that registers stragglerkit._C. Each component adds one block below.
#include <torch/extension.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include "executor.h"

namespace stragglerkit {
void reduce_add_(torch::Tensor& dst, const torch::Tensor& src, int64_t divisor);
}  // namespace stragglerkit

// ---- simulator (csrc/sim_core.cpp, used by stragglerkit/sim/graph.py) ----
namespace stragglerkit {
void register_simulator(pybind11::module_& m);
}  // namespace stragglerkit
// ---- end simulator ----

namespace {

// Wraps an optional Python callable (label, begin) into a C++ callback that takes the GIL.
std::function<void(int64_t, bool)> range_callback_from(const py::object& callback) {
  if (callback.is_none()) {
    return {};
  }
  auto holder = std::make_shared<py::object>(callback);
  return [holder](int64_t label, bool begin) {
    py::gil_scoped_acquire gil;
    (*holder)(label, begin);
  };
}

torch::Tensor execute(const c10::intrusive_ptr<c10d::ProcessGroup>& group, torch::Tensor buffer,
                      torch::Tensor scratch, torch::Tensor ops, torch::Tensor dep_count, torch::Tensor child_ptr,
                      torch::Tensor child_idx, torch::Tensor wait_order, torch::Tensor peers, torch::Tensor rank_map,
                      std::vector<std::string> labels, std::string algorithm, int64_t logical_rank, int64_t plan_id,
                      double timeout_seconds, const py::object& range_callback, const py::object& reverse_group,
                      bool concurrent_waits) {
  stragglerkit::PlanTables plan{ops,    dep_count, child_ptr,         child_idx, wait_order, peers, rank_map,
                                labels, algorithm, logical_rank, plan_id};
  if (!reverse_group.is_none()) {
    plan.reverse_group = reverse_group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  }
  plan.concurrent_waits = concurrent_waits;
  auto callback = range_callback_from(range_callback);
  py::gil_scoped_release no_gil;
  auto timings = stragglerkit::execute_plan(group, std::move(buffer), std::move(scratch), plan, timeout_seconds,
                                            callback);
  if (callback) {
    // Drop the Python reference with the GIL held.
    py::gil_scoped_acquire gil;
    callback = nullptr;
  }
  return timings;
}

// torch.profiler records on the thread that started it (and those torch hands its state to): the
// runtime's worker thread takes the calling thread's profiler state for the calls queued under it
// (stragglerkit/runtime/runtime.py). Only the profiler's part of the thread-local state travels.
struct ProfilerThreadState {
  std::shared_ptr<c10::ThreadLocalDebugInfo> debug_info = c10::ThreadLocalDebugInfo::current();
  at::RecordFunctionTLS record_function = at::get_record_function_tls_();
};

py::object call_with_profiler_state(const ProfilerThreadState& state, const py::function& fn) {
  c10::DebugInfoGuard debug_info(state.debug_info);
  const at::RecordFunctionTLS previous = at::get_record_function_tls_();
  at::set_record_function_tls_(state.record_function);
  try {
    py::object result = fn();
    at::set_record_function_tls_(previous);
    return result;
  } catch (...) {
    at::set_record_function_tls_(previous);
    throw;
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "stragglerkit native core: plan executor and reductions";

#ifdef STRAGGLERKIT_CUDA
  m.attr("cuda_kernel") = true;
#else
  m.attr("cuda_kernel") = false;
#endif
  // ^ whether this build holds the CUDA reduction kernel (reduce_cuda.cu): CUDA tensors need it

  // -- reductions --
  m.def("reduce_add_", &stragglerkit::reduce_add_, py::arg("dst"), py::arg("src"), py::arg("divisor") = 0,
        "dst += src (contiguous tensors, same dtype, size and device); with divisor > 0 (CPU, floating "
        "dtypes): dst = (dst + src) / divisor, as the sum followed by div_(divisor)");

  // -- executor --
  m.def("execute", &execute, py::arg("group"), py::arg("buffer"), py::arg("scratch"), py::arg("ops"),
        py::arg("dep_count"), py::arg("child_ptr"), py::arg("child_idx"), py::arg("wait_order"), py::arg("peers"),
        py::arg("rank_map"), py::arg("labels"), py::arg("algorithm"), py::arg("logical_rank"), py::arg("plan_id"),
        py::arg("timeout_seconds"), py::arg("range_callback"), py::arg("reverse_group") = py::none(),
        py::arg("concurrent_waits") = false,
        "Run one rank's lowered plan in place over a c10d ProcessGroup; returns the per-op timings.");
  m.def(
      "notify_local_failure",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& device, const std::string& algorithm) {
        stragglerkit::notify_local_failure(group, c10::Device(device), algorithm);
      },
      py::arg("group"), py::arg("device"), py::arg("algorithm"), py::call_guard<py::gil_scoped_release>(),
      "Tell the other ranks this rank's call failed on invalid arguments (they raise instead of waiting).");
  m.def("abort_notes", &stragglerkit::abort_notes, py::arg("group"), py::call_guard<py::gil_scoped_release>(),
        "Abort notes received from other ranks: (call, origin rank, reason code, remote rank, the origin's numel, "
        "dtype code and plan id).");
  m.def("shutdown_listeners", &stragglerkit::shutdown_listeners, py::call_guard<py::gil_scoped_release>(),
        "Stop the abort listener threads (called at interpreter exit).");

  // -- profiler state for the runtime's worker thread --
  py::class_<ProfilerThreadState>(m, "ProfilerThreadState",
                                  "The calling thread's torch.profiler state (taken when created).")
      .def(py::init<>());
  m.def("call_with_profiler_state", &call_with_profiler_state, py::arg("state"), py::arg("fn"),
        "Call fn() on this thread under the profiler state `state` (taken on another thread).");

  // -- simulator --
  stragglerkit::register_simulator(m);  // sim_extract_ops, sim_build_edges, sim_longest_path
}

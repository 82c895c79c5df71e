// Flattening of a Schedule's op lists into arrays for the simulator and the cost model
// (stragglerkit/sim/graph.py). Python validates the schedule (check.py); this only reads the
// fields of every Op object -- kind, chunks, peer, round, phase, depends -- in one pass at C speed,
// which is what dominates simulating a schedule with millions of ops. Anything unexpected raises
// a Python exception and graph.py says which op was malformed.
#include <Python.h>
#include <structmember.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace stragglerkit {

namespace {

// New reference to attribute `name` of `obj`, or a pybind11 error.
py::object get_attr(PyObject* obj, PyObject* name) {
  PyObject* value = PyObject_GetAttr(obj, name);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

int64_t to_int(PyObject* value, const char* field, int64_t rank, int64_t index) {
  if (!PyLong_Check(value)) {
    throw py::value_error("rank " + std::to_string(rank) + " op " + std::to_string(index) + ": field '" + field +
                          "' is not an int");
  }
  const long long v = PyLong_AsLongLong(value);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return static_cast<int64_t>(v);
}

int64_t optional_int(PyObject* value, const char* field, int64_t rank, int64_t index) {
  return value == Py_None ? -1 : to_int(value, field, rank, index);
}

// Reads the fields of an Op. Op is a slotted dataclass: for objects of exactly that type the six
// slots are read at their fixed offsets (borrowed references, no attribute lookup); any other
// object goes through PyObject_GetAttr.
class FieldReader {
 public:
  FieldReader(PyTypeObject* type, PyObject* const* names, int count) : type_(type) {
    for (int f = 0; f < count; ++f) {
      names_[f] = names[f];
      offsets_[f] = -1;
      PyObject* descr = PyObject_GetAttr(reinterpret_cast<PyObject*>(type), names[f]);
      if (descr == nullptr) {
        PyErr_Clear();
        continue;
      }
      if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
        if (member->type == T_OBJECT_EX || member->type == T_OBJECT) offsets_[f] = member->offset;
      }
      Py_DECREF(descr);
    }
  }

  // Borrowed (fast path) or owned (slow path) reference to field `f` of `op`, kept in `holder`.
  PyObject* get(PyObject* op, int f, py::object& holder) const {
    if (Py_TYPE(op) == type_ && offsets_[f] >= 0) {
      PyObject* value = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(op) + offsets_[f]);
      if (value != nullptr) return value;
    }
    holder = get_attr(op, names_[f]);
    return holder.ptr();
  }

 private:
  PyTypeObject* type_;
  PyObject* names_[8];
  Py_ssize_t offsets_[8];
};

PyObject* intern(const char* text) {
  PyObject* s = PyUnicode_InternFromString(text);
  if (s == nullptr) throw py::error_already_set();
  return s;
}

}  // namespace

// Returns (offsets, kind, chunk_start, chunk_stop, peer, round, phase, phase_names, dep_count, deps).
// `kinds` lists the OpKind members in code order (send, recv, recv_reduce, reduce, copy).
py::tuple sim_extract_ops(const py::list& ranks, const py::tuple& kinds) {
  static PyObject* const s_kind = intern("kind");
  static PyObject* const s_chunks = intern("chunks");
  static PyObject* const s_peer = intern("peer");
  static PyObject* const s_round = intern("round");
  static PyObject* const s_phase = intern("phase");
  static PyObject* const s_depends = intern("depends");

  const Py_ssize_t n = PyList_GET_SIZE(ranks.ptr());
  py::array_t<int64_t> offsets(n + 1);
  int64_t* off = offsets.mutable_data();
  off[0] = 0;
  for (Py_ssize_t r = 0; r < n; ++r) {
    PyObject* rank_ops = PyList_GET_ITEM(ranks.ptr(), r);
    if (!PyList_Check(rank_ops)) throw py::value_error("ops[" + std::to_string(r) + "] is not a list");
    off[r + 1] = off[r] + PyList_GET_SIZE(rank_ops);
  }
  const int64_t total = off[n];
  py::array_t<int64_t> kind(total), start(total), stop(total), peer(total), round(total), phase(total),
      dep_count(total);
  int64_t *k_out = kind.mutable_data(), *a_out = start.mutable_data(), *b_out = stop.mutable_data(),
          *p_out = peer.mutable_data(), *r_out = round.mutable_data(), *ph_out = phase.mutable_data(),
          *dc_out = dep_count.mutable_data();
  std::vector<int64_t> deps;
  deps.reserve(static_cast<size_t>(total) * 2);
  const Py_ssize_t num_kinds = PyTuple_GET_SIZE(kinds.ptr());
  std::unordered_map<PyObject*, int64_t> phase_code;  // keyed by object identity, names compared on a miss
  py::list phase_names;
  py::list keep_alive;

  enum Field { kKind, kChunks, kPeer, kRound, kPhase, kDepends };
  PyObject* const names[] = {s_kind, s_chunks, s_peer, s_round, s_phase, s_depends};
  PyTypeObject* op_type = nullptr;
  for (Py_ssize_t r = 0; r < n && op_type == nullptr; ++r) {
    PyObject* rank_ops = PyList_GET_ITEM(ranks.ptr(), r);
    if (PyList_GET_SIZE(rank_ops) > 0) op_type = Py_TYPE(PyList_GET_ITEM(rank_ops, 0));
  }
  const FieldReader reader(op_type != nullptr ? op_type : &PyBaseObject_Type, names, 6);
  py::object h_kind, h_chunks, h_peer, h_round, h_phase, h_depends;

  int64_t at = 0;
  for (Py_ssize_t r = 0; r < n; ++r) {
    PyObject* rank_ops = PyList_GET_ITEM(ranks.ptr(), r);
    const Py_ssize_t count = PyList_GET_SIZE(rank_ops);
    for (Py_ssize_t i = 0; i < count; ++i, ++at) {
      PyObject* op = PyList_GET_ITEM(rank_ops, i);
      PyObject* kind_obj = reader.get(op, kKind, h_kind);
      int64_t code = -1;
      for (Py_ssize_t c = 0; c < num_kinds; ++c) {
        if (PyTuple_GET_ITEM(kinds.ptr(), c) == kind_obj) code = c;
      }
      if (code < 0) throw py::value_error("rank " + std::to_string(r) + " op " + std::to_string(i) + ": unknown kind");
      k_out[at] = code;

      PyObject* chunks = reader.get(op, kChunks, h_chunks);
      if (!PyTuple_Check(chunks) || PyTuple_GET_SIZE(chunks) != 2) {
        throw py::value_error("rank " + std::to_string(r) + " op " + std::to_string(i) + ": chunks is not a pair");
      }
      a_out[at] = to_int(PyTuple_GET_ITEM(chunks, 0), "chunks", r, i);
      b_out[at] = to_int(PyTuple_GET_ITEM(chunks, 1), "chunks", r, i);
      p_out[at] = optional_int(reader.get(op, kPeer, h_peer), "peer", r, i);
      r_out[at] = optional_int(reader.get(op, kRound, h_round), "round", r, i);

      PyObject* phase_obj = reader.get(op, kPhase, h_phase);
      auto found = phase_code.find(phase_obj);
      if (found != phase_code.end()) {
        ph_out[at] = found->second;
      } else {
        int64_t pc = -1;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(phase_names.ptr()) && pc < 0; ++j) {
          const int same = PyObject_RichCompareBool(PyList_GET_ITEM(phase_names.ptr(), j), phase_obj, Py_EQ);
          if (same < 0) throw py::error_already_set();
          if (same == 1) pc = static_cast<int64_t>(j);
        }
        if (pc < 0) {
          pc = static_cast<int64_t>(phase_names.size());
          phase_names.append(py::reinterpret_borrow<py::object>(phase_obj));
        }
        // the key must outlive the loop: the op holds its own phase string; a looked-up one is kept here
        if (h_phase.ptr() == phase_obj) keep_alive.append(h_phase);
        phase_code.emplace(phase_obj, pc);
        ph_out[at] = pc;
      }

      PyObject* seq = reader.get(op, kDepends, h_depends);
      if (!PyTuple_Check(seq)) {
        throw py::value_error("rank " + std::to_string(r) + " op " + std::to_string(i) + ": depends is not a tuple");
      }
      const Py_ssize_t nd = PyTuple_GET_SIZE(seq);
      dc_out[at] = nd;
      for (Py_ssize_t d = 0; d < nd; ++d) deps.push_back(to_int(PyTuple_GET_ITEM(seq, d), "depends", r, i));
    }
  }
  py::array_t<int64_t> dep_array(static_cast<py::ssize_t>(deps.size()));
  std::copy(deps.begin(), deps.end(), dep_array.mutable_data());
  return py::make_tuple(offsets, kind, start, stop, peer, round, phase, phase_names, dep_count, dep_array);
}

}  // namespace stragglerkit

namespace stragglerkit {

namespace {

using IntArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

py::array_t<int64_t> to_array(const std::vector<int64_t>& values) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

}  // namespace

// The execution constraints of the task graph (graph.py builds the same with numpy when the
// extension is missing, and the tests compare the two). Inputs are the per-op arrays of
// sim_extract_ops; op kinds are coded 0 send, 1 recv, 2 recv_reduce, 3 reduce, 4 copy.
// Returns (send_ops, recv_ops, local_ops, op_task, edge_ptr, edge_dst, edge_from_op, one_flow_per_nic).
py::tuple sim_build_edges(const IntArray& offsets_in, const IntArray& kind_in, const IntArray& peer_in,
                          const IntArray& round_in, const IntArray& phase_in, const IntArray& dep_count_in,
                          const IntArray& deps_in, bool sync_rounds) {
  const int64_t n = offsets_in.size() - 1;
  const int64_t* offsets = offsets_in.data();
  const int64_t* kind = kind_in.data();
  const int64_t* peer = peer_in.data();
  const int64_t* round = round_in.data();
  const int64_t* phase = phase_in.data();
  const int64_t* dep_count = dep_count_in.data();
  const int64_t* deps = deps_in.data();
  const int64_t num_ops = offsets[n];
  if (kind_in.size() != num_ops || peer_in.size() != num_ops || round_in.size() != num_ops ||
      phase_in.size() != num_ops || dep_count_in.size() != num_ops) {
    throw py::value_error("sim_build_edges: per-op arrays differ in length");
  }

  std::vector<std::pair<int64_t, int64_t>> sends, recvs;  // (channel src*n+dst, op)
  std::vector<int64_t> local_ops;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
      const int64_t k = kind[i];
      if (k <= 2) {
        const int64_t p = peer[i];
        if (p < 0 || p >= n || p == r) {
          throw py::value_error("rank " + std::to_string(r) + " op " + std::to_string(i - offsets[r]) +
                                " has peer " + std::to_string(p) + ", not another rank of 0.." + std::to_string(n - 1));
        }
        if (k == 0) {
          sends.emplace_back(r * n + p, i);
        } else {
          recvs.emplace_back(p * n + r, i);
        }
      } else {
        local_ops.push_back(i);
      }
    }
  }
  std::sort(sends.begin(), sends.end());
  std::sort(recvs.begin(), recvs.end());
  bool paired = sends.size() == recvs.size();
  for (size_t m = 0; paired && m < sends.size(); ++m) paired = sends[m].first == recvs[m].first;
  if (!paired) {
    throw py::value_error("sends and receives do not pair up (" + std::to_string(sends.size()) + " sends, " +
                          std::to_string(recvs.size()) + " receives)");
  }
  const int64_t num_messages = static_cast<int64_t>(sends.size());
  const int64_t num_tasks = num_messages + static_cast<int64_t>(local_ops.size());
  std::vector<int64_t> op_task(num_ops), send_ops(num_messages), recv_ops(num_messages);
  for (int64_t m = 0; m < num_messages; ++m) {
    send_ops[m] = sends[m].second;
    recv_ops[m] = recvs[m].second;
    op_task[sends[m].second] = m;
    op_task[recvs[m].second] = m;
  }
  for (size_t j = 0; j < local_ops.size(); ++j) op_task[local_ops[j]] = num_messages + static_cast<int64_t>(j);

  // Every edge is generated twice by `for_each_edge`: once to count the edges of each source task,
  // once to write them into their CSR slots (no intermediate edge lists for millions of edges).
  auto for_each_edge = [&](auto&& emit) {
    auto add = [&](int64_t from_task, int64_t to_task, int64_t from_op) {
      if (from_task != to_task) emit(from_task, to_task, from_op);
    };
    // data dependencies
    int64_t at = 0;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
        for (int64_t j = 0; j < dep_count[i]; ++j, ++at) {
          const int64_t d = deps[at];
          if (d < 0 || d >= i - offsets[r]) {
            throw py::value_error("rank " + std::to_string(r) + " op " + std::to_string(i - offsets[r]) +
                                  " depends on op " + std::to_string(d) + ", which is not an earlier op of its rank");
          }
          add(op_task[offsets[r] + d], op_task[i], offsets[r] + d);
        }
      }
    }
    if (at != deps_in.size()) throw py::value_error("sim_build_edges: dependency counts do not match the list");
    // one connection per ordered pair: message m waits for the previous message on its pair
    for (int64_t m = 1; m < num_messages; ++m) {
      if (sends[m].first == sends[m - 1].first) add(m - 1, m, -1);
    }
    // rounds in order: every comm op of a round group waits for every comm op of the previous group
    if (sync_rounds) {
      std::vector<int64_t> previous, current;
      for (int64_t r = 0; r < n; ++r) {
        previous.clear();
        current.clear();
        int64_t cur_phase = -1, cur_round = -1;
        for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
          if (kind[i] > 2 || round[i] < 0) continue;
          if (current.empty() || phase[i] != cur_phase || round[i] != cur_round) {
            if (!current.empty()) previous.swap(current);
            current.clear();
            cur_phase = phase[i];
            cur_round = round[i];
          }
          for (int64_t p : previous) add(op_task[p], op_task[i], p);
          current.push_back(i);
        }
      }
    }
  };
  // With rounds in order, a rank whose every send and receive is round-tagged, at most one of each
  // per round, never has two flows on one NIC direction: the caller may skip the sharing check.
  bool one_flow_per_nic = sync_rounds;
  for (int64_t r = 0; r < n && one_flow_per_nic; ++r) {
    int64_t cur_phase = -1, cur_round = -1, group_sends = 0, group_recvs = 0;
    bool started = false;
    for (int64_t i = offsets[r]; i < offsets[r + 1] && one_flow_per_nic; ++i) {
      if (kind[i] > 2) continue;
      if (round[i] < 0) {
        one_flow_per_nic = false;
        break;
      }
      if (!started || phase[i] != cur_phase || round[i] != cur_round) {
        started = true;
        cur_phase = phase[i];
        cur_round = round[i];
        group_sends = group_recvs = 0;
      }
      if (kind[i] == 0) {
        ++group_sends;
      } else {
        ++group_recvs;
      }
      if (group_sends > 1 || group_recvs > 1) one_flow_per_nic = false;
    }
  }
  py::array_t<int64_t> edge_ptr_out(num_tasks + 1);
  int64_t* edge_ptr = edge_ptr_out.mutable_data();
  std::fill(edge_ptr, edge_ptr + num_tasks + 1, 0);
  for_each_edge([&](int64_t src, int64_t, int64_t) { ++edge_ptr[src + 1]; });
  for (int64_t t = 0; t < num_tasks; ++t) edge_ptr[t + 1] += edge_ptr[t];
  const int64_t num_edges = edge_ptr[num_tasks];
  py::array_t<int64_t> edge_dst(num_edges), edge_from(num_edges);
  int64_t* dst_out = edge_dst.mutable_data();
  int64_t* from_out = edge_from.mutable_data();
  std::vector<int64_t> fill(edge_ptr, edge_ptr + num_tasks);  // next free slot of each source, in order
  for_each_edge([&](int64_t src, int64_t dst, int64_t from_op) {
    const int64_t slot = fill[src]++;
    dst_out[slot] = dst;
    from_out[slot] = from_op;
  });
  return py::make_tuple(to_array(send_ops), to_array(recv_ops), to_array(local_ops), to_array(op_task),
                        edge_ptr_out, edge_dst, edge_from, one_flow_per_nic);
}

}  // namespace stragglerkit

namespace stragglerkit {

// Earliest completion of every task when nothing competes for bandwidth (graph.longest_path):
// done[t] = max(release[t], max over edges u->t of done[u] + edge_extra) + duration[t], in
// topological order (Kahn's algorithm). Returns (done, number of tasks processed); fewer than all
// means the constraints have a cycle and the caller reports the deadlock.
py::tuple sim_longest_path(const IntArray& edge_ptr_in, const IntArray& edge_dst_in,
                           const py::array_t<double, py::array::c_style | py::array::forcecast>& edge_extra_in,
                           const py::array_t<double, py::array::c_style | py::array::forcecast>& release_in,
                           const py::array_t<double, py::array::c_style | py::array::forcecast>& duration_in) {
  const int64_t num_tasks = release_in.size();
  if (edge_ptr_in.size() != num_tasks + 1 || duration_in.size() != num_tasks ||
      edge_extra_in.size() != edge_dst_in.size()) {
    throw py::value_error("sim_longest_path: array sizes do not match");
  }
  const int64_t* ptr = edge_ptr_in.data();
  const int64_t* dst = edge_dst_in.data();
  const double* extra = edge_extra_in.data();
  const double* duration = duration_in.data();
  std::vector<double> ready(release_in.data(), release_in.data() + num_tasks);
  std::vector<int64_t> pending(num_tasks, 0);
  for (int64_t e = 0; e < edge_dst_in.size(); ++e) ++pending[dst[e]];
  std::vector<int64_t> queue;
  queue.reserve(num_tasks);
  for (int64_t t = 0; t < num_tasks; ++t) {
    if (pending[t] == 0) queue.push_back(t);
  }
  py::array_t<double> done_out(num_tasks);
  double* done = done_out.mutable_data();
  std::fill(done, done + num_tasks, std::numeric_limits<double>::quiet_NaN());
  for (size_t head = 0; head < queue.size(); ++head) {
    const int64_t t = queue[head];
    const double finish = ready[t] + duration[t];
    done[t] = finish;
    for (int64_t e = ptr[t]; e < ptr[t + 1]; ++e) {
      const int64_t child = dst[e];
      const double when = finish + extra[e];
      if (when > ready[child]) ready[child] = when;
      if (--pending[child] == 0) queue.push_back(child);
    }
  }
  return py::make_tuple(done_out, static_cast<int64_t>(queue.size()));
}

void register_simulator(py::module_& m) {
  m.def("sim_longest_path", &sim_longest_path, "earliest task completion times over the task graph");
  m.def("sim_extract_ops", &sim_extract_ops, "flatten a Schedule's op lists into int64 arrays");
  m.def("sim_build_edges", &sim_build_edges, "messages and execution edges of a flattened schedule");
}

}  // namespace stragglerkit

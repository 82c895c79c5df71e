// The plan interpreter: runs one rank's lowered AllReduce plan over a c10d::ProcessGroup.
//
// Python (stragglerkit/runtime/plan.py) lowers a checked schedule into flat int64 tables; this code
// only executes them. See executor.cpp for the execution rules.
#pragma once

#include <torch/extension.h>

#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace stragglerkit {

// Op kinds of the lowered plan (plan.py: LoweredKind). NOOP is an op whose byte range is empty
// after lowering: it completes as soon as its dependencies have, without touching the network.
enum LoweredKind : int64_t { kSend = 0, kRecv = 1, kRecvReduce = 2, kReduce = 3, kCopy = 4, kNoop = 5 };

// Columns of the op table (plan.py: OpColumn, the same names and numbers).
enum OpColumn : int64_t {
  kColKind = 0,
  kColPeer = 1,      // logical peer rank (comm ops), -1 otherwise
  kColOffset = 2,    // element offset into the buffer
  kColCount = 3,     // element count
  kColScratch = 4,   // element offset into the scratch tensor (-1: none)
  kColLabel = 5,     // index into labels (phase/round), for NVTX ranges and error messages
  kColChanPrev = 6,  // previous comm op on the same (peer, direction) channel, -1: first
  kColChanNext = 7,  // next comm op on the same channel, -1: last
  kColDivide = 8,    // reductions only: divide the result by this (an averaging plan's final sums), 0: no
  kNumOpColumns = 9,
};

// Fields of the 8 x int64 header each rank sends to every peer before any data moves.
enum HeaderField : int64_t {
  kHdrMagic = 0,
  kHdrCall = 1,    // per-group call sequence number
  kHdrNumel = 2,
  kHdrDtype = 3,   // c10::ScalarType
  kHdrPlanId = 4,  // hash of (algorithm, world size, rank map, op, straggler, ...)
  kHdrWorld = 5,
  kHdrLogical = 6, // sender's logical rank
  kHdrSpare = 7,
  kHeaderLength = 8,
};

struct PlanTables {
  torch::Tensor ops;          // int64 [num_ops, kNumOpColumns]
  torch::Tensor dep_count;    // int64 [num_ops]
  torch::Tensor child_ptr;    // int64 [num_ops + 1], CSR of dependents
  torch::Tensor child_idx;    // int64 [num_children]
  torch::Tensor wait_order;   // int64 [num_waited]: non-empty comm ops in a deadlock-free order
  torch::Tensor peers;        // int64 [num_peers]: logical ranks this rank exchanges headers with
  torch::Tensor rank_map;     // int64 [world]: logical -> physical group rank
  std::vector<std::string> labels;
  std::string algorithm;
  int64_t logical_rank = 0;
  int64_t plan_id = 0;
  // Optional second group over the same ranks: data messages from a higher to a lower physical rank
  // travel over it, so each direction of a pair has its own connection (gloo's one connection per
  // pair carries one direction at a time; a swap then takes twice as long). Null: one group.
  c10::intrusive_ptr<c10d::ProcessGroup> reverse_group;
  // Observe completions concurrently, one waiter thread per (peer, direction) channel
  // (channel_waiters.h), instead of blocking in `wait_order`. For CPU tensors on gloo; the policy
  // (which buckets) lives in Python (runtime/executor.py, concurrent_waits).
  bool concurrent_waits = false;
};

// Runs the plan in place on `buffer` (1-D contiguous) with `scratch` (same dtype and device).
// Returns int64 [num_waited, 6] timings: op index, physical peer, bytes, kind, start_ns, end_ns
// (std::chrono::steady_clock, i.e. CLOCK_MONOTONIC, comparable with Python's time.monotonic_ns()).
torch::Tensor execute_plan(const c10::intrusive_ptr<c10d::ProcessGroup>& group, torch::Tensor buffer,
                           torch::Tensor scratch, const PlanTables& plan, double timeout_seconds,
                           const std::function<void(int64_t, bool)>& range_callback);

// Tells the other ranks that this rank's call failed before it started (invalid arguments), so that
// they raise instead of waiting; keeps the group's call numbering in step.
void notify_local_failure(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const c10::Device& device,
                          const std::string& algorithm);

// The abort notes this rank has received: (call, origin rank, reason code, remote rank).
std::vector<std::vector<int64_t>> abort_notes(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// Stops the abort listeners of every group (called at interpreter exit).
void shutdown_listeners();

// dst += src for `count` elements of `dtype` (CPU: vectorised loop; CUDA: reduce_cuda.cu kernel).
// With `divisor` > 0 (CPU, floating types only): dst = (dst + src) / divisor, rounded as the sum
// followed by torch's `div_(divisor)` would be.
void reduce_add_span(void* dst, const void* src, int64_t count, c10::ScalarType dtype, const c10::Device& device,
                     int64_t divisor = 0);

}  // namespace stragglerkit

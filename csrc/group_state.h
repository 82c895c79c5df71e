// Per-process-group state shared by all calls: the call counter and the abort listener.
//
// Every gloo group gets one listener thread with a receive-from-any posted on a reserved tag. A
// rank whose call fails sends each rank a small abort note (call number, origin, reason, remote
// rank, and the origin's tensor size, dtype and plan id, so a mismatch is explained on both
// sides); the listener records it and wakes the wait the executor is blocked in, so that rank
// raises too. NCCL groups have no receive-from-any: there the notes are off and NCCL's watchdog
// reports faults. States are never freed: they own threads and transport buffers that a failed
// call may leave registered with the transport.
#pragma once

#include <torch/extension.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace stragglerkit {

constexpr int kAbortTag = 1'839'100'002;
constexpr int64_t kAbortMagic = 0x53544b41425431;  // "STKABT1"

enum AbortReason : int64_t {
  kReasonMismatch = 1,
  kReasonTimeout = 2,
  kReasonPeerFailure = 3,
  kReasonOther = 4,
  kReasonInvalid = 5,
};

const char* reason_text(int64_t reason);

// An abort note received from another rank.
struct AbortNote {
  int64_t origin = -1;
  int64_t reason = 0;
  int64_t remote = -1;
  // The origin's numel, dtype (c10::ScalarType) and plan id: a rank told of a mismatch involving
  // it can say what differs even when the origin's header has not reached it yet.
  int64_t numel = -1;
  int64_t dtype = -1;
  int64_t plan_id = -1;
};

// Per process group: call counter, abort listener, and a place to keep buffers that a failed call
// may leave registered with the transport (never freed: the transport may still write to them).
struct GroupState {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::mutex mu;
  int64_t calls = 0;
  int64_t active_call = -1;
  std::map<int64_t, AbortNote> aborts;  // call number -> note
  std::vector<c10::intrusive_ptr<c10d::Work>> blocked;  // works the executor is waiting on now
  c10::intrusive_ptr<c10d::Work> listen_work;
  std::thread listener;
  std::atomic<bool> stopping{false};
  bool listens = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> graveyard;
  std::vector<torch::Tensor> kept_tensors;

  // The executor registers each work while it blocks on it, so an abort note can wake it.
  void block_on(const c10::intrusive_ptr<c10d::Work>& work) {
    std::lock_guard<std::mutex> lock(mu);
    blocked.push_back(work);
  }
  void unblock(const c10::intrusive_ptr<c10d::Work>& work) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = blocked.begin(); it != blocked.end(); ++it) {
      if (*it == work) {
        blocked.erase(it);
        return;
      }
    }
  }
};

// The state of `group`, created (and its listener started) on first use.
GroupState* group_state(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// The name of the backend ("gloo", "nccl", ...) that moves `group`'s tensors on `device`.
std::string backend_name(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const c10::Device& device);

}  // namespace stragglerkit

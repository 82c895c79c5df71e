// Per-process-group state: call counter, abort notes and their listener (see group_state.h).
#include "group_state.h"

#include <chrono>

#include "executor.h"

namespace stragglerkit {

const char* reason_text(int64_t reason) {
  switch (reason) {
    case kReasonMismatch: return "tensor or plan mismatch";
    case kReasonTimeout: return "timeout";
    case kReasonPeerFailure: return "peer failure";
    case kReasonInvalid: return "invalid arguments";
    default: return "error";
  }
}

namespace {

std::mutex& registry_mutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::map<c10d::ProcessGroup*, GroupState*>& registry() {
  // Leaked on purpose: the states own threads and transport buffers that must outlive exit.
  static auto* groups = new std::map<c10d::ProcessGroup*, GroupState*>();
  return *groups;
}

// How long the listener's receive waits. It must never time out: when a gloo wait times out, gloo
// closes every connection of the group ("Application timeout caused pair closure"), so a listener
// that waited with the group's own timeout killed any group left idle that long (30 min by
// default; a training loop with the executor on the default group died after it). Ten years: far
// beyond any job, and far from overflowing the condition variable's nanosecond deadline. The
// listener ends when the group is shut down (its work is aborted) or fails.
constexpr std::chrono::milliseconds kListenWait = std::chrono::hours(24 * 365 * 10);

void listen_for_aborts(GroupState* state) {
  while (!state->stopping.load()) {
    auto note = torch::zeros({kHeaderLength}, torch::kInt64);  // gloo: host memory
    std::vector<torch::Tensor> tensors{note};
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = state->group->recvAnysource(tensors, kAbortTag);
    } catch (const std::exception&) {
      return;  // the group is gone or does not support it
    }
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->listen_work = work;
      state->graveyard.push_back(work);
      state->kept_tensors.push_back(note);
    }
    bool received = false;
    try {
      received = work->wait(kListenWait);
    } catch (const std::exception&) {
      return;  // the group failed (a peer died, another wait timed out): nothing more to hear
    }
    if (!received || state->stopping.load()) {
      return;
    }
    const int64_t* fields = note.data_ptr<int64_t>();
    if (fields[0] != kAbortMagic) {
      continue;
    }
    std::lock_guard<std::mutex> lock(state->mu);
    AbortNote abort_note{fields[2], fields[3], fields[4], fields[5], fields[6], fields[7]};
    state->aborts.emplace(fields[1], abort_note);
    if (state->active_call == fields[1]) {
      for (auto& blocked : state->blocked) blocked->abort();
    }
  }
}

}  // namespace

std::string backend_name(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const c10::Device& device) {
  try {
    return group->getBackend(device.type())->getBackendName();
  } catch (const std::exception&) {
    return group->getBackendName();  // no backend registered for the device: the group's own
  }
}

GroupState* group_state(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& groups = registry();
  auto it = groups.find(group.get());
  if (it != groups.end()) {
    return it->second;
  }
  auto* state = new GroupState();
  state->group = group;
  // Receive-from-any is a gloo feature; NCCL reports faults through its own watchdog.
  state->listens = group->getBackendName() == "gloo";
  if (state->listens) {
    state->listener = std::thread(listen_for_aborts, state);
  }
  groups.emplace(group.get(), state);
  return state;
}

std::vector<std::vector<int64_t>> abort_notes(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  std::vector<std::vector<int64_t>> out;
  GroupState* state = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(group.get());
    if (it == registry().end()) return out;
    state = it->second;
  }
  std::lock_guard<std::mutex> lock(state->mu);
  for (const auto& entry : state->aborts) {
    const AbortNote& note = entry.second;
    out.push_back({entry.first, note.origin, note.reason, note.remote, note.numel, note.dtype, note.plan_id});
  }
  return out;
}

void shutdown_listeners() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (auto& entry : registry()) {
    GroupState* state = entry.second;
    state->stopping.store(true);
    {
      std::lock_guard<std::mutex> state_lock(state->mu);
      if (state->listen_work) state->listen_work->abort();
    }
    if (state->listener.joinable()) state->listener.join();
  }
}

}  // namespace stragglerkit

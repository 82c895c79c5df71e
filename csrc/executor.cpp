// Plan interpreter: executes one rank's lowered, already checked AllReduce plan over a c10d group.
//
// (This file is longer than the project's ~600-line guide on purpose: the interpreter is one state
// machine, class Run, whose posting, observing and fault paths share its state; what stands apart
// already lives apart: reductions in reduce.cpp, per-group state and abort listeners in
// group_state.cpp, per-channel waiter threads in channel_waiters.h.)
//
// Execution rules (the symbolic checker's model, stragglerkit/schedules/check.py):
// * An op becomes *ready* when all its dependencies completed. Local ops (reduce, copy, empty ops)
//   run at once; a send or receive is *posted* (non-blocking pg->send / pg->recv) as soon as it is
//   ready, its predecessor on the same (peer, direction) channel has been posted -- messages of one
//   pair match in program order -- and the peer's header has been validated (below). Everything
//   that can be in flight is in flight. A dependency that the lowering marked as met on posting
//   (a child stored as -(b + 1): the next message of the same connection where nothing but their
//   order links them, runtime/plan.py) counts once its predecessor is posted: the connection
//   keeps their order, and the waiters observe a channel's completions in posting order.
// * Completion is observed by blocking on works in `wait_order`: a global, deadlock-free order of
//   the messages computed by plan.py (a simulated run in which a known straggler arrives last).
//   Gloo works cannot be polled, so one blocking order is needed; because every rank waits in the
//   same global order and posts eagerly, the wait on the k-th message returns once both sides
//   have waited through messages 1..k-1 (induction on k). Transfers still progress in the
//   background in any order. A recv_reduce adds the received scratch into the buffer right after
//   its wait(), on the current stream (CUDA: the stream that wait() synchronised).
// * Nothing involves the whole group: a rank only ever talks to the peers in its plan, so with
//   StragglAR the punctual ranks run their pre-phase while the straggler is still away.
//
// Validation before data moves: on entry a rank posts an 8 x int64 header (call number, numel,
// dtype, plan id) to every plan peer and a receive for each peer's header. Receives from a peer
// are posted only after that peer's header has arrived and matched, which happens lazily, the
// first time the wait order reaches an op with that peer. Sends are posted at once: the transports
// move a message only once the receiver has posted its receive (gloo's pairs wait for the
// receiver's ready notice; NCCL's send is a rendezvous), so no byte lands in a peer's memory before
// that peer validated this rank's header, and the header round trip stays off the critical path.
// Posting receives before the header would save that round trip at the start of a call, but a
// receive must never meet a message of another size: gloo's TCP transport then terminates the
// process ("Received data size doesn't match expected size", an enforce in its I/O thread).
// Both sides of a pair compare the same fields, so both detect a mismatch.
//
// Faults (gloo): every group has an abort listener thread with one receive from any source posted
// on a reserved tag. A rank that fails (header mismatch, timeout, dead peer) sends a small abort
// note to every rank; a rank that receives one wakes its blocked wait (Work::abort) and raises,
// so all ranks get an error that names the failing rank and its remote rank, and nobody waits for
// a timeout. Best effort: gloo closes a pair whose wait timed out, so a note cannot travel over
// it; the rank at the other end then fails at once on the closed connection instead. After an
// error the group's in-flight messages are undefined: the caller must treat the tensor as lost
// and re-create the process group, as after an NCCL abort.
//
// CUDA tensors over gloo: gloo's transport reads and writes host memory only (it would hand the
// socket a device pointer), so each message is staged: a send copies its span to a host tensor
// when it is posted (ordered after the reductions already queued on the current stream), and a
// receive lands in a host tensor that is copied into its device span once the wait returned,
// before the reduction kernel runs on the same stream. Headers and abort notes stay on the host.
// NCCL moves device memory itself and needs none of this.
#include "executor.h"

#include "channel_waiters.h"
#include "group_state.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace stragglerkit {

namespace {

constexpr int kDataTag = 1'839'100'000;
constexpr int kHeaderTag = 1'839'100'001;
constexpr int64_t kHeaderMagic = 0x53544b48445231;  // "STKHDR1"

// How long a rank whose connection broke waits for another rank's abort note (the root cause).
constexpr int64_t kRootCauseGraceMs = 300;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// An error raised on this rank; `reason` and `remote` travel in the abort note.
struct ExecFailure : std::runtime_error {
  ExecFailure(const std::string& what, int64_t reason_code, int64_t remote_rank)
      : std::runtime_error(what), reason(reason_code), remote(remote_rank) {}
  int64_t reason;
  int64_t remote;
};

std::string describe_bytes(int64_t count, int64_t element_size) {
  std::ostringstream out;
  out << count * element_size << " bytes";
  return out.str();
}

class Run {
 public:
  Run(GroupState* state, const PlanTables& plan, torch::Tensor buffer, torch::Tensor scratch, double timeout_seconds,
      const std::function<void(int64_t, bool)>& range_callback)
      : state_(state),
        group_(state->group),
        plan_(plan),
        buffer_(std::move(buffer)),
        scratch_(std::move(scratch)),
        timeout_(std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000.0))),
        range_callback_(range_callback) {
    if (plan_.ops.defined()) {
      ops_ = plan_.ops.data_ptr<int64_t>();
      num_ops_ = plan_.ops.size(0);
    }
    stage_through_host_ = !buffer_.is_cpu() && backend_name(group_, buffer_.device()) == "gloo";
    // The transport's device: where headers and staged messages live.
    wire_device_ = buffer_.is_cpu() || stage_through_host_ ? c10::Device(c10::kCPU) : buffer_.device();
    post_ahead_ = wire_device_.is_cpu();
    element_size_ = buffer_.element_size();
    physical_rank_ = group_->getRank();
  }

  // Sends the abort note for a call that failed before it started (invalid arguments).
  void announce_failure(int64_t call, const ExecFailure& failure) {
    call_ = call;
    broadcast_abort(failure);
  }

  torch::Tensor run(int64_t call) {
    call_ = call;
    const int64_t num_waited = plan_.wait_order.numel();
    timings_ = torch::empty({num_waited, 6}, torch::kInt64);
    try {
      execute();
    } catch (const ExecFailure& failure) {
      fail(failure);
    } catch (const std::exception& err) {
      fail(ExecFailure(context() + ": " + err.what(), kReasonOther, -1));
    }
    close_range();
    return timings_;
  }

 private:
  // ---- tables -------------------------------------------------------------------------------
  int64_t col(int64_t op, OpColumn column) const { return ops_[op * kNumOpColumns + column]; }
  int64_t physical(int64_t logical) const { return plan_.rank_map.data_ptr<int64_t>()[logical]; }

  std::string context() const {
    std::ostringstream out;
    out << "stragglerkit all_reduce (algorithm " << plan_.algorithm << ", call #" << call_ << ") on rank "
        << physical_rank_ << " (logical " << plan_.logical_rank << ")";
    return out.str();
  }

  std::string rank_name(int64_t logical) const {
    std::ostringstream out;
    out << "rank " << physical(logical) << " (logical " << logical << ")";
    return out.str();
  }

  std::string describe_op(int64_t op) const {
    std::ostringstream out;
    const int64_t kind = col(op, kColKind);
    const char* verb = kind == kSend ? "send" : kind == kRecv ? "receive" : kind == kRecvReduce ? "receive-reduce" : "op";
    out << verb << " of " << describe_bytes(col(op, kColCount), element_size_) << " (elements "
        << col(op, kColOffset) << ".." << col(op, kColOffset) + col(op, kColCount) << ")";
    const int64_t label = col(op, kColLabel);
    if (label >= 0 && label < static_cast<int64_t>(plan_.labels.size())) {
      out << " in " << plan_.labels[label];
    }
    out << " (op " << op << ")";
    return out.str();
  }

  torch::Tensor buffer_span(int64_t op) const {
    return buffer_.narrow(0, col(op, kColOffset), col(op, kColCount));
  }
  torch::Tensor scratch_span(int64_t op) const {
    return scratch_.narrow(0, col(op, kColScratch), col(op, kColCount));
  }

  // ---- main loop -----------------------------------------------------------------------------
  void execute() {
    check_not_aborted(-1);
    if (plan_.concurrent_waits) {
      waiters_ = std::make_unique<ChannelWaiters>(state_, call_, timeout_);
    }
    post_headers();
    pending_.assign(plan_.dep_count.data_ptr<int64_t>(), plan_.dep_count.data_ptr<int64_t>() + num_ops_);
    ready_.assign(num_ops_, false);
    done_.assign(num_ops_, false);
    works_.assign(num_ops_, c10::intrusive_ptr<c10d::Work>());
    start_ns_.assign(num_ops_, 0);
    for (int64_t op = 0; op < num_ops_; ++op) {
      if (pending_[op] == 0) {
        worklist_.push_back(op);
      }
    }
    drain();
    if (waiters_) {
      observe_concurrently();
    } else {
      observe_in_wait_order();
    }
    for (int64_t op = 0; op < num_ops_; ++op) {
      if (!done_[op]) {
        throw ExecFailure(context() + ": internal error: " + describe_op(op) + " never ran", kReasonOther, -1);
      }
    }
    // Peers whose ops all came out empty (tiny buffers) still validate, so a mismatch is reported.
    const int64_t* peers = plan_.peers.data_ptr<int64_t>();
    for (int64_t k = 0; k < plan_.peers.numel(); ++k) {
      validate_header(peers[k]);
    }
    for (auto& entry : header_sends_) {
      wait_for(entry.second, -1, entry.first);
    }
    header_sends_.clear();
  }

  // Every rank blocks on its messages in the plan's global wait order (see the top of this file).
  void observe_in_wait_order() {
    const int64_t* order = plan_.wait_order.data_ptr<int64_t>();
    const int64_t num_waited = plan_.wait_order.numel();
    for (int64_t position = 0; position < num_waited; ++position) {
      const int64_t op = order[position];
      const int64_t peer = col(op, kColPeer);
      validate_header(peer);
      drain();  // what posting the deferred receives made ready
      if (!works_[op]) {
        throw ExecFailure(context() + ": internal error: " + describe_op(op) +
                              " is not posted when its turn to complete came; the plan's wait order is broken",
                          kReasonOther, peer);
      }
      enter_range(col(op, kColLabel));
      wait_for(works_[op], op, peer);
      finish_message(position, op, now_ns());
    }
  }

  // A message completed at `end_ns` (the position-th completion): record its timing row, land a
  // staged receive, reduce, then complete it and post what became ready.
  void finish_message(int64_t position, int64_t op, int64_t end_ns) {
    int64_t* row = timings_.data_ptr<int64_t>() + position * 6;
    row[0] = op;
    row[1] = physical(col(op, kColPeer));
    row[2] = col(op, kColCount) * element_size_;
    row[3] = col(op, kColKind);
    row[4] = start_ns_[op];
    row[5] = end_ns;
    message_range(op, false);
    land_staged(op);
    if (col(op, kColKind) == kRecvReduce) {
      reduce_into_buffer(op);
    }
    works_[op].reset();
    complete(op);
    drain();
  }

  // One waiter thread per channel reports completions as they happen (channel_waiters.h); this
  // thread reduces, completes and posts in the order the completions arrive.
  void observe_concurrently() {
    int64_t outstanding = plan_.wait_order.numel() + static_cast<int64_t>(header_recvs_.size());
    const int64_t num_waited = plan_.wait_order.numel();
    int64_t position = 0;
    while (outstanding > 0) {
      Completion done = waiters_->next();
      --outstanding;
      if (!done.ok) {
        check_not_aborted(done.op);
        if (done.peer < 0) {
          throw ExecFailure(context() + ": " + done.error, kReasonOther, -1);
        }
        ExecFailure failure = wait_failure(done.op, done.peer, done.error);
        if (failure.reason == kReasonTimeout) {
          // Several channels time out at about the same time when one peer stalls; the message
          // posted first and still incomplete is the head of the chain of waits: blame its peer.
          const int64_t oldest = oldest_in_flight();
          if (oldest >= 0 && oldest != done.op) {
            failure = wait_failure(oldest, col(oldest, kColPeer), done.error);
          }
        }
        throw failure;
      }
      if (done.op < 0) {
        check_header(done.peer);
        drain();  // what posting the deferred receives made ready
        continue;
      }
      const int64_t op = done.op;
      if (position >= num_waited) {
        throw ExecFailure(context() + ": internal error: more completions than messages", kReasonOther, -1);
      }
      enter_range(col(op, kColLabel));
      finish_message(position++, op, done.end_ns);
    }
    waiters_->stop();
  }

  // The posted, incomplete message that was posted first (-1: none).
  int64_t oldest_in_flight() const {
    int64_t oldest = -1;
    for (int64_t op = 0; op < num_ops_; ++op) {
      if (works_[op] && !done_[op] && (oldest < 0 || start_ns_[op] < start_ns_[oldest])) oldest = op;
    }
    return oldest;
  }

  void complete(int64_t op) {
    done_[op] = true;
    const int64_t* child_ptr = plan_.child_ptr.data_ptr<int64_t>();
    const int64_t* child_idx = plan_.child_idx.data_ptr<int64_t>();
    for (int64_t k = child_ptr[op]; k < child_ptr[op + 1]; ++k) {
      const int64_t child = child_idx[k];
      if (child < 0 && post_ahead_) continue;  // met when this op was posted (post())
      const int64_t waiting = child < 0 ? -child - 1 : child;
      if (--pending_[waiting] == 0) {
        worklist_.push_back(waiting);
      }
    }
  }

  // Runs local ops and posts comm ops that became ready, until nothing more can start.
  void drain() {
    while (!worklist_.empty()) {
      const int64_t op = worklist_.front();
      worklist_.pop_front();
      switch (col(op, kColKind)) {
        case kNoop:
          complete(op);
          break;
        case kReduce:
          reduce_into_buffer(op);
          complete(op);
          break;
        case kCopy:
          buffer_span(op).copy_(scratch_span(op));
          complete(op);
          break;
        default:
          ready_[op] = true;
          try_post(op);
      }
    }
  }

  void try_post(int64_t op) {
    while (op >= 0) {
      if (!ready_[op] || works_[op] || done_[op]) return;
      const int64_t prev = col(op, kColChanPrev);
      if (prev >= 0 && !works_[prev] && !done_[prev]) return;  // channel predecessor not posted yet
      const int64_t peer = col(op, kColPeer);
      if (col(op, kColKind) != kSend && !header_ok_.count(peer)) {
        deferred_[peer].push_back(op);
        return;
      }
      post(op);
      op = col(op, kColChanNext);
    }
  }

  void post(int64_t op) {
    const int64_t kind = col(op, kColKind);
    const int peer = static_cast<int>(physical(col(op, kColPeer)));
    start_ns_[op] = now_ns();
    message_range(op, true);
    std::vector<torch::Tensor> tensors;
    try {
      // Messages from the higher to the lower physical rank use the reverse group when there is one.
      const int sender = kind == kSend ? physical_rank_ : peer;
      const int receiver = kind == kSend ? peer : physical_rank_;
      const auto& group = plan_.reverse_group.defined() && sender > receiver ? plan_.reverse_group : group_;
      if (kind == kSend) {
        tensors.push_back(stage_through_host_ ? stage(op, buffer_span(op).cpu()) : buffer_span(op));
        works_[op] = group->send(tensors, peer, kDataTag);
      } else {
        torch::Tensor destination = receive_span(op);
        tensors.push_back(stage_through_host_ ? stage(op, torch::empty_like(destination, torch::kCPU)) : destination);
        works_[op] = group->recv(tensors, peer, kDataTag);
      }
    } catch (const std::exception& err) {
      throw peer_failure(col(op, kColPeer), "could not start the " + describe_op(op), err.what());
    }
    if (waiters_) {
      waiters_->enqueue(col(op, kColPeer), kind == kSend, works_[op], op);
    }
    // Dependents stored as -(b + 1) only need this message posted: the next message of the same
    // connection where nothing but their order links them (runtime/plan.py: _after_post_edges).
    const int64_t* child_ptr = plan_.child_ptr.data_ptr<int64_t>();
    const int64_t* child_idx = plan_.child_idx.data_ptr<int64_t>();
    for (int64_t k = child_ptr[op]; post_ahead_ && k < child_ptr[op + 1]; ++k) {
      const int64_t child = child_idx[k];
      if (child < 0 && --pending_[-child - 1] == 0) {
        worklist_.push_back(-child - 1);
      }
    }
  }

  ExecFailure peer_failure(int64_t peer, const std::string& doing, const std::string& error) const {
    return ExecFailure(context() + ": " + doing + " with " + rank_name(peer) + ": " + error +
                           " (the connection is gone: rank " + std::to_string(physical(peer)) +
                           " exited, crashed, or gave up on this rank after a timeout)",
                       kReasonPeerFailure, physical(peer));
  }

  // Where a receive's bytes go: scratch for a receive-reduce or a receive into scratch, else the buffer.
  torch::Tensor receive_span(int64_t op) const {
    const bool into_scratch = col(op, kColKind) == kRecvReduce || col(op, kColScratch) >= 0;
    return into_scratch ? scratch_span(op) : buffer_span(op);
  }

  // Keeps `host`, the host copy of op's message, until the message completed.
  torch::Tensor stage(int64_t op, torch::Tensor host) {
    staged_[op] = host;
    return host;
  }

  // After op's message completed: a staged receive's bytes go to their device span (on the current
  // stream, so the reduction that follows is ordered after them); the host copy is released.
  void land_staged(int64_t op) {
    auto it = staged_.find(op);
    if (it == staged_.end()) return;
    if (col(op, kColKind) != kSend) {
      receive_span(op).copy_(it->second);
    }
    staged_.erase(it);
  }

  void reduce_into_buffer(int64_t op) {
    with_reduce_range([&] {
      reduce_add_span(buffer_span(op).data_ptr(), scratch_span(op).data_ptr(), col(op, kColCount),
                      buffer_.scalar_type(), buffer_.device(), col(op, kColDivide));
    });
  }

  // ---- headers -------------------------------------------------------------------------------
  torch::Tensor make_header() const {
    auto header = torch::empty({kHeaderLength}, torch::kInt64);
    int64_t* h = header.data_ptr<int64_t>();
    h[kHdrMagic] = kHeaderMagic;
    h[kHdrCall] = call_;
    h[kHdrNumel] = buffer_.numel();
    h[kHdrDtype] = static_cast<int64_t>(buffer_.scalar_type());
    h[kHdrPlanId] = plan_.plan_id;
    h[kHdrWorld] = plan_.rank_map.numel();
    h[kHdrLogical] = plan_.logical_rank;
    h[kHdrSpare] = 0;
    return header.to(wire_device_);
  }

  void post_headers() {
    auto header = make_header();
    const int64_t* peers = plan_.peers.data_ptr<int64_t>();
    for (int64_t k = 0; k < plan_.peers.numel(); ++k) {
      const int64_t peer = peers[k];
      std::vector<torch::Tensor> out{header};
      auto incoming = torch::empty({kHeaderLength}, torch::dtype(torch::kInt64).device(wire_device_));
      std::vector<torch::Tensor> in{incoming};
      try {
        header_sends_.emplace_back(peer, group_->send(out, static_cast<int>(physical(peer)), kHeaderTag));
        header_recvs_[peer] = {group_->recv(in, static_cast<int>(physical(peer)), kHeaderTag), incoming};
      } catch (const std::exception& err) {
        throw peer_failure(peer, "could not start the header exchange", err.what());
      }
      if (waiters_) {
        waiters_->enqueue(peer, false, header_recvs_[peer].first, -1);
      }
    }
  }

  void validate_header(int64_t peer) {
    if (header_ok_.count(peer)) return;
    auto it = header_recvs_.find(peer);
    if (it == header_recvs_.end()) {
      throw ExecFailure(context() + ": internal error: no header exchange with " + rank_name(peer), kReasonOther,
                        peer);
    }
    wait_for(it->second.first, -1, peer);
    check_header(peer);
  }

  // Compares `peer`'s received header with this rank's; on a match posts the receives that waited.
  void check_header(int64_t peer) {
    if (header_ok_.count(peer)) return;
    auto it = header_recvs_.find(peer);
    auto theirs = it->second.second.cpu();
    auto mine = make_header().cpu();
    const int64_t* t = theirs.data_ptr<int64_t>();
    const int64_t* m = mine.data_ptr<int64_t>();
    std::ostringstream problem;
    if (t[kHdrMagic] != kHeaderMagic) {
      problem << rank_name(peer) << " sent a malformed header (is it running the same stragglerkit version?)";
    } else if (t[kHdrCall] != m[kHdrCall]) {
      problem << "this is this rank's all_reduce call #" << m[kHdrCall] << " on the group but " << rank_name(peer)
              << "'s call #" << t[kHdrCall] << ": every rank must make the same sequence of calls";
    } else if (t[kHdrNumel] != m[kHdrNumel] || t[kHdrDtype] != m[kHdrDtype]) {
      problem << tensor_difference(rank_name(peer), t[kHdrNumel], t[kHdrDtype]);
    } else if (t[kHdrPlanId] != m[kHdrPlanId] || t[kHdrWorld] != m[kHdrWorld] || t[kHdrLogical] != peer) {
      problem << plan_difference(rank_name(peer), t[kHdrPlanId]);
    }
    const std::string text = problem.str();
    if (!text.empty()) {
      throw ExecFailure(context() + ": mismatch detected before any data moved: " + text, kReasonMismatch, peer);
    }
    header_ok_.insert(peer);
    auto deferred = std::move(deferred_[peer]);
    deferred_.erase(peer);
    for (int64_t op : deferred) {
      try_post(op);
    }
  }

  // ---- waiting, faults -------------------------------------------------------------------------
  void check_not_aborted(int64_t op) {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->aborts.find(call_);
    if (it == state_->aborts.end()) return;
    throw_aborted(it->second, op);
  }

  // The error of a rank that another rank's abort note stopped: names the rank that failed first
  // and the peer it blamed (the root cause), and marks this rank as not to re-broadcast.
  [[noreturn]] void throw_aborted(const AbortNote& note, int64_t op) {
    std::ostringstream out;
    out << context() << ": aborted because rank " << note.origin << " failed (" << reason_text(note.reason);
    if (note.remote >= 0) out << " involving rank " << note.remote;
    out << ")";
    if (note.reason == kReasonMismatch && note.remote == physical_rank_) {
      // The origin's header may not have reached this rank yet (its abort note can overtake it):
      // the note carries what the origin passed, so this rank can say what differs.
      out << ": " << mismatch_with_note(note);
    }
    out << "; see rank " << note.origin << "'s error for details";
    if (op >= 0) out << ". This rank was waiting for the " << describe_op(op);
    aborted_by_peer_ = true;
    throw ExecFailure(out.str(), note.reason, note.origin);
  }

  // What differs between this rank's call and that of a note's origin, from the note's fields.
  std::string mismatch_with_note(const AbortNote& note) const {
    const std::string origin = "rank " + std::to_string(note.origin);
    if (note.numel != buffer_.numel() || note.dtype != static_cast<int64_t>(buffer_.scalar_type())) {
      return tensor_difference(origin, note.numel, note.dtype);
    }
    if (note.plan_id != plan_.plan_id) {
      return plan_difference(origin, note.plan_id);
    }
    return origin + " saw a different call number or rank mapping: every rank must make the same sequence of calls";
  }

  // The mismatch text for `other`'s tensor (`numel` elements of ScalarType `dtype`) against this rank's.
  std::string tensor_difference(const std::string& other, int64_t numel, int64_t dtype) const {
    std::ostringstream out;
    out << "this rank's tensor has " << buffer_.numel() << " elements of " << c10::toString(buffer_.scalar_type())
        << " but " << other << "'s has " << numel << " elements of "
        << c10::toString(static_cast<c10::ScalarType>(dtype)) << ": every rank must pass a tensor of the same size and dtype";
    return out.str();
  }

  // The mismatch text for `other` running plan `plan_id` where this rank runs its own.
  std::string plan_difference(const std::string& other, int64_t plan_id) const {
    std::ostringstream out;
    out << other << " runs a different plan (plan id " << plan_id << " vs this rank's " << plan_.plan_id
        << "): every rank must pass the same algorithm, op, straggler, slowdowns and rank mapping";
    return out.str();
  }

  void wait_for(const c10::intrusive_ptr<c10d::Work>& work, int64_t op, int64_t peer) {
    check_not_aborted(op);
    state_->block_on(work);
    try {
      check_not_aborted(op);  // a note that came just before the work was registered
    } catch (...) {
      state_->unblock(work);
      throw;
    }
    bool completed = false;
    std::string error;
    try {
      completed = work->wait(timeout_);
    } catch (const std::exception& err) {
      error = err.what();
    }
    state_->unblock(work);
    check_not_aborted(op);
    if (completed && error.empty()) return;
    throw wait_failure(op, peer, error);
  }

  // The error for a wait on `op` (-1: the header exchange) with `peer` that raised `error`.
  ExecFailure wait_failure(int64_t op, int64_t peer, const std::string& error) const {
    const std::string what = op >= 0 ? "the " + describe_op(op) : std::string("its header exchange");
    const bool timed_out = error.find("imed out") != std::string::npos || error.find("imeout") != std::string::npos;
    std::ostringstream out;
    out << context() << ": ";
    if (timed_out) {
      out << "timed out after " << timeout_.count() / 1000.0 << " s waiting for " << rank_name(peer) << " to complete "
          << what << "; " << rank_name(peer)
          << " did not do its part in time: it is stalled or dead, did not call all_reduce, or waits for another rank";
    } else {
      out << rank_name(peer) << " failed during " << what << ": " << (error.empty() ? "wait() returned false" : error);
    }
    return ExecFailure(out.str(), timed_out ? kReasonTimeout : kReasonPeerFailure, physical(peer));
  }

  void fail(const ExecFailure& failure) {
    close_range();
    std::vector<c10::intrusive_ptr<c10d::Work>> abandoned;
    if (waiters_) {
      waiters_->stop();
      abandoned = waiters_->abandoned();
    }
    // Keep everything the transport may still touch alive for the life of the process.
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      for (auto& work : abandoned) state_->graveyard.push_back(work);
      for (auto& work : works_) {
        if (work) state_->graveyard.push_back(work);
      }
      for (auto& entry : header_sends_) state_->graveyard.push_back(entry.second);
      for (auto& entry : header_recvs_) {
        state_->graveyard.push_back(entry.second.first);
        state_->kept_tensors.push_back(entry.second.second);
      }
      state_->kept_tensors.push_back(scratch_);
      state_->kept_tensors.push_back(buffer_);
      for (auto& entry : staged_) state_->kept_tensors.push_back(entry.second);
    }
    if (!aborted_by_peer_ && failure.reason == kReasonPeerFailure && state_->listens) {
      // A broken connection is often the echo of another rank's failure (a rank that timed out
      // closes its connections). Give that rank's abort note a moment to arrive, so the error
      // reported here names the root cause rather than the messenger.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRootCauseGraceMs);
      while (std::chrono::steady_clock::now() < deadline) {
        {
          std::lock_guard<std::mutex> lock(state_->mu);
          auto it = state_->aborts.find(call_);
          if (it != state_->aborts.end()) {
            try {
              throw_aborted(it->second, -1);
            } catch (const ExecFailure& root) {
              throw std::runtime_error(std::string(root.what()) + " (this rank saw: " + failure.what() + ")");
            }
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    if (!aborted_by_peer_ && state_->listens) {
      broadcast_abort(failure);
    }
    throw std::runtime_error(failure.what());
  }

  void broadcast_abort(const ExecFailure& failure) {
    auto note = torch::zeros({kHeaderLength}, torch::kInt64);
    int64_t* n = note.data_ptr<int64_t>();
    n[0] = kAbortMagic;
    n[1] = call_;
    n[2] = physical_rank_;
    n[3] = failure.reason;
    n[4] = failure.remote;
    n[5] = buffer_.numel();
    n[6] = static_cast<int64_t>(buffer_.scalar_type());
    n[7] = plan_.plan_id;  // the note stays on the host: only gloo groups send and hear them
    std::vector<c10::intrusive_ptr<c10d::Work>> sends;
    for (int rank = 0; rank < group_->getSize(); ++rank) {
      if (rank == physical_rank_) continue;
      std::vector<torch::Tensor> tensors{note};
      try {
        sends.push_back(group_->send(tensors, rank, kAbortTag));
      } catch (const std::exception&) {
      }
    }
    // Give the notes a moment to leave (a peer's listener starts with its first call); a dead
    // peer's note may never go.
    const auto grace = std::min(std::max(timeout_, std::chrono::milliseconds(2000)), std::chrono::milliseconds(10000));
    for (auto& work : sends) {
      try {
        work->wait(grace);
      } catch (const std::exception&) {
      }
    }
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->kept_tensors.push_back(note);
    for (auto& work : sends) state_->graveyard.push_back(work);
  }

  // ---- NVTX ranges (only when a callback is given) -------------------------------------------
  // The callback takes (code, begin): code >= 0 is a label (phase/round: one at a time, nested in
  // the call), -1 a reduction, -(op + 2) the message `op` from its posting to its observed completion
  // (messages overlap: stragglerkit/runtime/executor.py gives them ranges that need not nest).
  void message_range(int64_t op, bool begin) {
    if (range_callback_) range_callback_(-op - 2, begin);
  }
  void enter_range(int64_t label) {
    if (!range_callback_ || label == current_label_) return;
    close_range();
    current_label_ = label;
    range_callback_(label, true);
  }
  void close_range() {
    if (range_callback_ && current_label_ >= 0) {
      range_callback_(current_label_, false);
    }
    current_label_ = -1;
  }
  template <typename F>
  void with_reduce_range(F&& body) {
    if (range_callback_) range_callback_(-1, true);
    body();
    if (range_callback_) range_callback_(-1, false);
  }

  GroupState* state_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  const PlanTables& plan_;
  torch::Tensor buffer_;
  torch::Tensor scratch_;
  std::chrono::milliseconds timeout_;
  const std::function<void(int64_t, bool)>& range_callback_;
  const int64_t* ops_ = nullptr;
  int64_t num_ops_ = 0;
  // CUDA tensors over gloo: every message goes through a host copy (top of this file).
  bool stage_through_host_ = false;
  c10::Device wire_device_ = c10::Device(c10::kCPU);
  // Whether dependents marked -(b + 1) count as met at posting (messages in host memory). Not on
  // NCCL: it runs a pair's sends and receives on one stream in posting order, so a receive posted
  // ahead could block a send to the same peer that the old order put first.
  bool post_ahead_ = true;
  int64_t element_size_ = 1;
  int physical_rank_ = 0;
  int64_t call_ = 0;
  bool aborted_by_peer_ = false;
  int64_t current_label_ = -1;
  torch::Tensor timings_;

  std::vector<int64_t> pending_;
  std::vector<bool> ready_;
  std::vector<bool> done_;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::vector<int64_t> start_ns_;
  std::deque<int64_t> worklist_;
  std::set<int64_t> header_ok_;
  std::map<int64_t, std::vector<int64_t>> deferred_;
  std::vector<std::pair<int64_t, c10::intrusive_ptr<c10d::Work>>> header_sends_;
  std::map<int64_t, std::pair<c10::intrusive_ptr<c10d::Work>, torch::Tensor>> header_recvs_;
  std::unique_ptr<ChannelWaiters> waiters_;  // concurrent mode only
  std::map<int64_t, torch::Tensor> staged_;  // op -> host copy of its message (stage_through_host_)
};

}  // namespace

torch::Tensor execute_plan(const c10::intrusive_ptr<c10d::ProcessGroup>& group, torch::Tensor buffer,
                           torch::Tensor scratch, const PlanTables& plan, double timeout_seconds,
                           const std::function<void(int64_t, bool)>& range_callback) {
  TORCH_CHECK(buffer.dim() == 1 && buffer.is_contiguous(), "stragglerkit: the executor takes a 1-D contiguous buffer");
  TORCH_CHECK(scratch.scalar_type() == buffer.scalar_type() && scratch.device() == buffer.device(),
              "stragglerkit: scratch must match the buffer's dtype and device");
  TORCH_CHECK(plan.ops.dim() == 2 && plan.ops.size(1) == kNumOpColumns, "stragglerkit: malformed op table");
  TORCH_CHECK(plan.rank_map.numel() == group->getSize(), "stragglerkit: the plan is for ", plan.rank_map.numel(),
              " ranks but the group has ", group->getSize());
  GroupState* state = group_state(group);
  int64_t call;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    call = ++state->calls;
    state->active_call = call;
  }
  Run run(state, plan, std::move(buffer), std::move(scratch), timeout_seconds, range_callback);
  torch::Tensor timings;
  try {
    timings = run.run(call);
  } catch (...) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->active_call = -1;
    throw;
  }
  std::lock_guard<std::mutex> lock(state->mu);
  state->active_call = -1;
  return timings;
}

void notify_local_failure(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const c10::Device& device,
                          const std::string& algorithm) {
  GroupState* state = group_state(group);
  int64_t call;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    call = ++state->calls;
  }
  if (!state->listens) return;
  PlanTables plan;
  plan.algorithm = algorithm;
  auto buffer = torch::empty({0}, torch::dtype(torch::kFloat).device(device));
  std::function<void(int64_t, bool)> no_callback;
  Run run(state, plan, buffer, buffer, 2.0, no_callback);
  run.announce_failure(call, ExecFailure("invalid arguments", kReasonInvalid, -1));
}

}  // namespace stragglerkit

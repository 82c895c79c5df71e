// Concurrent completion observation for the plan interpreter (executor.cpp).
//
// Gloo's send/recv works cannot be polled: the only way to learn that a message completed is to
// block in Work::wait(). Waiting on all of a rank's messages in one global order (the executor's
// ordered mode) is deadlock-free but observes a completion only when every message before it in
// that order has been observed; a pipelined schedule with several independent streams per rank
// (OptCC's healthy ring, upload and download; StragglAR's swaps with different peers) then moves
// at the pace of its slowest stream, one wait at a time.
//
// ChannelWaiters gives every channel -- one (peer, direction) pair of a rank -- its own thread. A
// channel's messages match in program order (the transport pairs them in posting order), so each
// thread waits on its channel's works in the order they were posted and hands each completion
// (or error) to the interpreter's thread through one queue. The interpreter does all the
// bookkeeping, reductions and posting on its own thread; the waiter threads only block.
//
// Works being waited on are registered in the group's `blocked` list, so that an abort note from
// another rank (group_state.cpp) wakes them. stop() aborts what is still being waited on and joins
// the threads; it is called on every exit path.
#pragma once

#include <torch/extension.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "group_state.h"

namespace stragglerkit {

// One observed completion. `op` is the plan op, or -1 for a peer's header receive.
struct Completion {
  int64_t op = -1;
  int64_t peer = -1;  // logical peer
  int64_t end_ns = 0;
  bool ok = true;
  std::string error;  // what wait() raised (empty: it returned false)
};

class ChannelWaiters {
 public:
  ChannelWaiters(GroupState* state, int64_t call, std::chrono::milliseconds timeout)
      : state_(state), call_(call), timeout_(timeout) {}
  ChannelWaiters(const ChannelWaiters&) = delete;
  ChannelWaiters& operator=(const ChannelWaiters&) = delete;
  ~ChannelWaiters() { stop(); }

  // Queues `work` behind the earlier works of channel (peer, is_send); starts that channel's thread
  // on first use.
  void enqueue(int64_t peer, bool is_send, c10::intrusive_ptr<c10d::Work> work, int64_t op) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& channel = channels_[{peer, is_send}];
    if (!channel) {
      channel = std::make_unique<Channel>();
      Channel* raw = channel.get();
      raw->thread = std::thread([this, raw] { serve(raw); });
    }
    channel->items.push_back(Item{std::move(work), op, peer});
    channel->wake.notify_one();
  }

  // Blocks until a completion is available. Every wait is bounded by the timeout, so one arrives
  // within it unless nothing is being waited on (a broken plan): then a failed Completion says so.
  Completion next() {
    std::unique_lock<std::mutex> lock(mu_);
    const auto limit = timeout_ + std::chrono::seconds(5);
    if (!done_cv_.wait_for(lock, limit, [this] { return !done_.empty(); })) {
      return Completion{-1, -1, 0, false, "internal error: no message completed or failed within the timeout"};
    }
    Completion out = std::move(done_.front());
    done_.pop_front();
    return out;
  }

  // Aborts the works still being waited on, drops queued ones, joins every thread. Idempotent.
  void stop() {
    std::vector<std::unique_ptr<Channel>> channels;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      for (auto& entry : channels_) {
        Channel* channel = entry.second.get();
        for (auto& item : channel->items) abandoned_.push_back(item.work);
        channel->items.clear();
        if (channel->current) {
          try {
            channel->current->abort();
          } catch (const std::exception&) {
          }
        }
        channel->wake.notify_one();
        channels.push_back(std::move(entry.second));
      }
      channels_.clear();
    }
    for (auto& channel : channels) {
      if (channel->thread.joinable()) channel->thread.join();
    }
  }

  // Works that were queued but never waited on (the caller keeps them alive after a failure).
  std::vector<c10::intrusive_ptr<c10d::Work>> abandoned() const { return abandoned_; }

 private:
  struct Item {
    c10::intrusive_ptr<c10d::Work> work;
    int64_t op;
    int64_t peer;
  };
  struct Channel {
    std::deque<Item> items;
    std::condition_variable wake;
    c10::intrusive_ptr<c10d::Work> current;
    std::thread thread;
  };

  void serve(Channel* channel) {
    while (true) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        channel->wake.wait(lock, [&] { return stopped_ || !channel->items.empty(); });
        if (stopped_) return;
        item = std::move(channel->items.front());
        channel->items.pop_front();
        channel->current = item.work;
      }
      state_->block_on(item.work);
      Completion result{item.op, item.peer, 0, false, {}};
      if (aborted()) {  // the note came before this work was registered: do not wait for the timeout
        result.error = "aborted by another rank";
      } else {
        try {
          result.ok = item.work->wait(timeout_);
        } catch (const std::exception& err) {
          result.ok = false;
          result.error = err.what();
        }
      }
      result.end_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
      state_->unblock(item.work);
      {
        std::lock_guard<std::mutex> lock(mu_);
        channel->current.reset();
        const bool failed = !result.ok;
        done_.push_back(std::move(result));
        done_cv_.notify_one();
        if (failed) return;  // later messages of this channel cannot complete in order
      }
    }
  }

  bool aborted() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->aborts.count(call_) > 0;
  }

  GroupState* state_;
  int64_t call_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<Completion> done_;
  std::map<std::pair<int64_t, bool>, std::unique_ptr<Channel>> channels_;
  std::vector<c10::intrusive_ptr<c10d::Work>> abandoned_;
  bool stopped_ = false;
};

}  // namespace stragglerkit

// Credit accounting between a worker and the broker: how many batches the
// worker holds, how much credit the broker may still spend, and what the
// next HELLO or DONE should grant.
//
// Pure state: no sockets, no clock. Not thread-safe (the loop owns it).
//
// Invariant with a broker that keeps its promise: broker credit == free
// slots. Each DONE grants free slots - broker credit, which is the number of
// slots freed since the last DONE; if the broker ever sends more than it was
// granted, the extra batches queue locally and the slots they use are not
// granted again, so the broker's credit never exceeds our free slots.
#pragma once

#include <cstdint>

namespace fleet::worker {

class CreditLedger {
 public:
  // `slots` >= 1: the worker's concurrency.
  explicit CreditLedger(std::uint32_t slots) : slots_(slots), capacity_(slots) {}

  // How many of the slots can take a batch now (a process handler's slots
  // count once their process is ready); at most `slots`. Lowering it below
  // what the broker holds makes the next grants 0 until it is spent.
  void SetCapacity(std::uint32_t capacity) { capacity_ = capacity < slots_ ? capacity : slots_; }
  std::uint32_t capacity() const { return capacity_; }

  // Usable slots not holding a batch (0 while extra batches wait locally).
  std::uint32_t free() const { return held_ >= capacity_ ? 0 : capacity_ - held_; }
  std::uint32_t held() const { return held_; }
  std::uint32_t broker_credit() const { return broker_credit_; }
  bool over_committed() const { return held_ > slots_; }

  // A HELLO replaces the broker's credit with what it carries. Returns the
  // credit to send: free slots, or 0 while draining.
  std::uint32_t OnHello(bool draining) {
    broker_credit_ = draining ? 0 : free();
    return broker_credit_;
  }

  // `n` batches arrived. The broker's credit cannot go below 0.
  void OnDispatch(std::uint32_t n) {
    held_ += n;
    broker_credit_ = n > broker_credit_ ? 0 : broker_credit_ - n;
  }

  // A slot reported a batch finished.
  void OnCompleted() {
    if (held_ > 0) --held_;
  }

  // The credit for the next DONE (0 while draining); adds it to the broker's
  // credit, so call it only for a DONE that is then sent.
  std::uint32_t TakeGrant(bool draining) {
    if (draining || free() <= broker_credit_) return 0;
    const std::uint32_t grant = free() - broker_credit_;
    broker_credit_ += grant;
    return grant;
  }

  // True when a DONE would grant credit (slots became usable, or were
  // freed, since the last one).
  bool GrantDue(bool draining) const { return !draining && free() > broker_credit_; }

  // Undoes TakeGrant(`grant`) when that DONE could not be sent.
  void ReturnGrant(std::uint32_t grant) {
    broker_credit_ = grant > broker_credit_ ? 0 : broker_credit_ - grant;
  }

 private:
  const std::uint32_t slots_;
  std::uint32_t capacity_;           // usable slots, <= slots_
  std::uint32_t held_ = 0;           // dispatched to us, not yet finished
  std::uint32_t broker_credit_ = 0;  // what the broker may still send us
};

}  // namespace fleet::worker

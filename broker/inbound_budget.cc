#include "broker/inbound_budget.h"

#include <algorithm>

namespace fleet::broker {

InboundBudget::InboundBudget(std::uint64_t budget_bytes, Duration grace)
    : budget_(budget_bytes), grace_(grace) {}

InboundBudget::Entry* InboundBudget::Find(int fd) {
  if (fd < 0 || static_cast<std::size_t>(fd) >= by_fd_.size()) return nullptr;
  Entry& e = by_fd_[static_cast<std::size_t>(fd)];
  return e.open ? &e : nullptr;
}

void InboundBudget::Release(Entry& e) {
  if (!e.proven) {
    reserved_ -= e.charge;
    --unproven_;
  }
  e.open = false;
  --open_;
}

void InboundBudget::TrimQueue() {
  auto stale = [this](const Queued& q) {
    const Entry& e = by_fd_[static_cast<std::size_t>(q.fd)];
    return !e.open || e.proven || e.generation != q.generation;
  };
  while (!unproven_order_.empty() && stale(unproven_order_.front())) unproven_order_.pop_front();
  // Proven connections behind a silent one stay queued until it goes;
  // compacting when they outnumber the live entries keeps the queue
  // proportional to the unproven connections (amortised O(1) per accept).
  if (unproven_order_.size() > 2 * unproven_ + 64) {
    unproven_order_.erase(
        std::remove_if(unproven_order_.begin(), unproven_order_.end(), stale),
        unproven_order_.end());
  }
}

InboundBudget::Decision InboundBudget::OnAccepted(int fd, std::size_t endpoint,
                                                  std::uint64_t charge, TimePoint now) {
  Decision d;
  if (fd < 0) return d;
  if (Entry* old = Find(fd)) Release(*old);  // the fd was reused: that one closed
  TrimQueue();
  if (reserved_ + charge > budget_) {
    // Oldest silent connections first, only those past their grace, and
    // only if enough of them make room: evicting without admitting would
    // cost them and gain nothing.
    std::uint64_t freed = 0;
    std::size_t victims = 0;
    for (const Queued& q : unproven_order_) {
      if (reserved_ - freed + charge <= budget_) break;
      const Entry& e = by_fd_[static_cast<std::size_t>(q.fd)];
      if (!e.open || e.proven || e.generation != q.generation) continue;
      if (now - e.since < grace_) break;  // the rest are younger still
      freed += e.charge;
      ++victims;
    }
    if (reserved_ - freed + charge > budget_) return d;  // refused
    while (victims > 0) {
      const Queued q = unproven_order_.front();
      unproven_order_.pop_front();
      Entry& e = by_fd_[static_cast<std::size_t>(q.fd)];
      if (!e.open || e.proven || e.generation != q.generation) continue;
      Release(e);
      d.evict.push_back({q.fd, e.endpoint});
      --victims;
    }
  }
  if (static_cast<std::size_t>(fd) >= by_fd_.size()) {
    by_fd_.resize(std::max<std::size_t>(static_cast<std::size_t>(fd) + 1, by_fd_.size() * 2));
  }
  Entry& e = by_fd_[static_cast<std::size_t>(fd)];
  e.open = true;
  e.proven = false;
  e.endpoint = endpoint;
  e.charge = charge;
  e.generation = next_generation_++;
  e.since = now;
  unproven_order_.push_back({fd, e.generation});
  reserved_ += charge;
  ++unproven_;
  ++open_;
  d.admitted = true;
  return d;
}

bool InboundBudget::OnProven(int fd) {
  Entry* e = Find(fd);
  if (e == nullptr || e->proven) return false;
  e->proven = true;
  reserved_ -= e->charge;
  --unproven_;
  return true;
}

void InboundBudget::OnClosed(int fd, std::size_t endpoint) {
  Entry* e = Find(fd);
  if (e != nullptr && e->endpoint == endpoint) Release(*e);
}

}  // namespace fleet::broker

#include "broker/journal_records.h"

#include "broker/journal.h"

namespace fleet::broker::records {
void EncodeAcceptedHead(std::string* out, std::string_view id, std::string_view queue) {
  out->clear();
  PutItem(*out, id);
  PutItem(*out, queue);
}

void EncodeAccepted(std::string* out, std::string_view id, std::string_view queue,
                    std::string_view payload) {
  EncodeAcceptedHead(out, id, queue);
  out->append(payload);
}

void EncodeDispatched(std::string* out, std::uint32_t attempts, std::string_view id) {
  out->clear();
  PutLe32(*out, attempts);
  out->append(id);
}

void StoreAttempts(char out[4], std::uint32_t attempts) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((attempts >> (8 * i)) & 0xff);
}

std::optional<Accepted> DecodeAccepted(std::string_view body) {
  Accepted a;
  if (!TakeItem(&body, &a.id) || !TakeItem(&body, &a.queue) || a.id.empty()) {
    return std::nullopt;
  }
  a.payload = body;
  return a;
}

std::optional<Dispatched> DecodeDispatched(std::string_view body) {
  if (body.size() < 5) return std::nullopt;
  return Dispatched{ReadLe32(body.data()), body.substr(4)};
}

std::size_t AcceptedBytes(std::string_view id, std::string_view queue, std::string_view payload) {
  return 8 + id.size() + queue.size() + payload.size();
}

std::string_view BatchId(std::uint8_t type, std::string_view body) {
  switch (type) {
    case kAccepted:
      if (auto a = DecodeAccepted(body)) return a->id;
      return {};
    case kFinished: return body;
    case kDispatched:
      if (auto d = DecodeDispatched(body)) return d->id;
      return {};
    default: return {};
  }
}

}  // namespace fleet::broker::records

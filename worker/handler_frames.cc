#include "worker/handler_frames.h"

#include <msgpack.hpp>

#include <algorithm>

#include "common/msgpack_write.h"

namespace fleet::worker::frames {
namespace {

using mp::PackBin;
using mp::Packer;
using mp::PackStr;
using mp::StringSink;

// Reserves the header, lets `body` append the body, then fills the length.
template <typename F>
void AppendFrame(std::string* out, F&& body) {
  const std::size_t at = out->size();
  out->append(kHeaderBytes, '\0');
  StringSink sink{out};
  Packer p(sink);
  body(p);
  const auto n = static_cast<std::uint32_t>(out->size() - at - kHeaderBytes);
  (*out)[at] = static_cast<char>(n >> 24);
  (*out)[at + 1] = static_cast<char>(n >> 16);
  (*out)[at + 2] = static_cast<char>(n >> 8);
  (*out)[at + 3] = static_cast<char>(n);
}

// str and bin point into the body instead of being copied.
bool ReferenceAll(msgpack::type::object_type, std::size_t, void*) { return true; }

bool Bytes(const msgpack::object& o, std::string_view* out) {
  if (o.type == msgpack::type::STR) {
    *out = {o.via.str.ptr, o.via.str.size};
    return true;
  }
  if (o.type == msgpack::type::BIN) {
    *out = {o.via.bin.ptr, o.via.bin.size};
    return true;
  }
  return false;
}

}  // namespace

void AppendBatch(std::string* out, std::string_view id, std::string_view payload,
                 std::uint32_t attempt, std::string_view queue) {
  AppendFrame(out, [&](Packer& p) {
    p.pack_array(5);
    PackStr(p, "batch");
    PackStr(p, id);
    PackBin(p, payload);
    p.pack_uint32(attempt);
    PackStr(p, queue);
  });
}

void AppendObject(std::string* out, std::uint64_t tag, std::uint32_t status, std::uint64_t total,
                  std::uint64_t offset, std::string_view data, std::string_view error) {
  AppendFrame(out, [&](Packer& p) {
    p.pack_array(7);
    PackStr(p, "object");
    p.pack_uint64(tag);
    p.pack_uint32(status);
    p.pack_uint64(total);
    p.pack_uint64(offset);
    PackBin(p, data);
    PackStr(p, error);
  });
}

void AppendGet(std::string* out, std::uint64_t tag, std::string_view digest, std::uint64_t offset,
               std::uint64_t length) {
  AppendFrame(out, [&](Packer& p) {
    p.pack_array(5);
    PackStr(p, "get");
    p.pack_uint64(tag);
    PackBin(p, digest);
    p.pack_uint64(offset);
    p.pack_uint64(length);
  });
}

void AppendReady(std::string* out, std::uint32_t version, std::uint32_t depth) {
  AppendFrame(out, [&](Packer& p) {
    p.pack_array(depth > 0 ? 3 : 2);
    PackStr(p, "ready");
    p.pack_uint32(version);
    if (depth > 0) p.pack_uint32(depth);
  });
}

void AppendOk(std::string* out, std::string_view id, std::string_view result) {
  AppendFrame(out, [&](Packer& p) {
    p.pack_array(3);
    PackStr(p, "ok");
    PackStr(p, id);
    PackBin(p, result);
  });
}

void AppendError(std::string* out, std::string_view id, std::string_view message) {
  AppendFrame(out, [&](Packer& p) {
    p.pack_array(3);
    PackStr(p, "error");
    PackStr(p, id);
    PackStr(p, message);
  });
}

Scan ScanFrame(std::string_view buffer, std::size_t max_body, std::size_t* body_size) {
  if (buffer.size() < kHeaderBytes) return Scan::kNeedMore;
  const auto* b = reinterpret_cast<const unsigned char*>(buffer.data());
  const std::size_t n = (std::size_t{b[0]} << 24) | (std::size_t{b[1]} << 16) |
                        (std::size_t{b[2]} << 8) | std::size_t{b[3]};
  *body_size = n;
  if (n > max_body) return Scan::kTooLarge;
  return buffer.size() - kHeaderBytes >= n ? Scan::kFrame : Scan::kNeedMore;
}

bool DecodeHandlerMessage(std::string_view body, HandlerMessage* out, std::string* why) {
  if (body.empty()) {
    *why = "empty frame";
    return false;
  }
  // Every element is bounded by the body itself; at most 3 elements and no
  // nesting are meaningful, so tight limits refuse a hostile header early.
  const msgpack::unpack_limit limits(/*array=*/8, /*map=*/0, /*str=*/body.size(),
                                     /*bin=*/body.size(), /*ext=*/0, /*depth=*/2);
  try {
    thread_local msgpack::zone zone;
    struct ClearZone {
      ~ClearZone() { zone.clear(); }
    } clear_zone;
    std::size_t offset = 0;
    const msgpack::object root =
        msgpack::unpack(zone, body.data(), body.size(), offset, ReferenceAll, nullptr, limits);
    if (offset != body.size()) {
      *why = std::to_string(body.size() - offset) + " bytes after the message in its frame";
      return false;
    }
    if (root.type != msgpack::type::ARRAY || root.via.array.size == 0 ||
        root.via.array.ptr[0].type != msgpack::type::STR) {
      *why = "a frame must hold an array that starts with the message's name";
      return false;
    }
    const msgpack::object* e = root.via.array.ptr;
    const std::uint32_t n = root.via.array.size;
    const std::string_view name(e[0].via.str.ptr, e[0].via.str.size);
    if (name == "ready") {
      if ((n != 2 && n != 3) || e[1].type != msgpack::type::POSITIVE_INTEGER ||
          (n == 3 && e[2].type != msgpack::type::POSITIVE_INTEGER)) {
        *why = "ready must be [\"ready\", version] or [\"ready\", version, depth]";
        return false;
      }
      out->kind = HandlerMessage::Kind::kReady;
      out->version = static_cast<std::uint32_t>(std::min<std::uint64_t>(e[1].via.u64, UINT32_MAX));
      out->depth = 1;
      if (n == 3) {
        if (e[2].via.u64 == 0) {
          *why = "ready's depth must be at least 1";
          return false;
        }
        out->depth = static_cast<std::uint32_t>(std::min<std::uint64_t>(e[2].via.u64, kMaxDepth));
      }
      return true;
    }
    if (name == "ok" || name == "error") {
      const bool ok = name == "ok";
      if (n != 3 || !Bytes(e[1], &out->id) || !Bytes(e[2], &out->data)) {
        *why = ok ? "ok must be [\"ok\", id, result]" : "error must be [\"error\", id, message]";
        return false;
      }
      out->kind = ok ? HandlerMessage::Kind::kOk : HandlerMessage::Kind::kError;
      return true;
    }
    if (name == "get") {
      const auto uint = [](const msgpack::object& o) {
        return o.type == msgpack::type::POSITIVE_INTEGER;
      };
      if (n != 5 || !uint(e[1]) || !Bytes(e[2], &out->data) || !uint(e[3]) || !uint(e[4])) {
        *why = "get must be [\"get\", tag, digest, offset, length]";
        return false;
      }
      out->kind = HandlerMessage::Kind::kGet;
      out->tag = e[1].via.u64;
      out->offset = e[3].via.u64;
      out->length = e[4].via.u64;
      return true;
    }
    std::string shown(name.substr(0, 32));
    *why = "unknown message \"" + shown + "\"";
    return false;
  } catch (const msgpack::unpack_error& e) {
    *why = std::string("not MessagePack: ") + e.what();
  } catch (const std::exception& e) {
    *why = std::string("unreadable frame: ") + e.what();
  }
  return false;
}

bool DecodeBatchForTests(std::string_view body, std::string* id, std::string* payload) {
  const msgpack::unpack_limit limits(8, 0, body.size(), body.size(), 0, 2);
  try {
    msgpack::object_handle h = msgpack::unpack(body.data(), body.size(), nullptr, nullptr, limits);
    const msgpack::object& root = h.get();
    std::string_view name, i, p;
    if (root.type != msgpack::type::ARRAY || root.via.array.size < 5 ||
        !Bytes(root.via.array.ptr[0], &name) || name != "batch" ||
        !Bytes(root.via.array.ptr[1], &i) || !Bytes(root.via.array.ptr[2], &p)) {
      return false;
    }
    id->assign(i);
    payload->assign(p);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool DecodeObjectForTests(std::string_view body, std::uint64_t* tag, std::uint32_t* status,
                          std::uint64_t* total, std::uint64_t* offset, std::string* data,
                          std::string* error) {
  const msgpack::unpack_limit limits(8, 0, body.size(), body.size(), 0, 2);
  try {
    msgpack::object_handle h = msgpack::unpack(body.data(), body.size(), nullptr, nullptr, limits);
    const msgpack::object& root = h.get();
    std::string_view name, d, err;
    if (root.type != msgpack::type::ARRAY || root.via.array.size != 7) return false;
    const msgpack::object* e = root.via.array.ptr;
    if (!Bytes(e[0], &name) || name != "object" || !Bytes(e[5], &d) || !Bytes(e[6], &err)) {
      return false;
    }
    *tag = e[1].as<std::uint64_t>();
    *status = e[2].as<std::uint32_t>();
    *total = e[3].as<std::uint64_t>();
    *offset = e[4].as<std::uint64_t>();
    data->assign(d);
    error->assign(err);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace fleet::worker::frames

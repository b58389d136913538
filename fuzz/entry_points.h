// The fuzzing entry points for fleet's decoders, shared by the libFuzzer
// targets (fuzz/fuzz_*.cc, built with clang by fuzz/CMakeLists.txt) and the
// corpus regression test (tests/common/fuzz_corpus_test.cc, built with the
// normal test suite), so a crash input added to fuzz/corpus/ stays checked
// without clang.
//
// Each function feeds one input to a decoder exactly as the processes do
// (same function, same limits) and checks cheap invariants on what comes
// back. It returns an empty string when every invariant held, else a
// description of the first one broken. A crash, a sanitizer report or an
// exception escaping is a failure too: the decoders are documented never to
// throw, so nothing is caught here.
//
// Thread-safe: no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/msgpack_read.h"

namespace fleet::fuzz {

// proto::Decode with the limits of every caller (the worker, producer and
// control client's defaults; the broker's, derived from its default
// options) and with tight limits. For a decoded message: fields within the
// limits, byte fields borrowed from the input, decode(encode(m)) gives m back
// (compared by a second encoding), and a message accepted under tighter
// limits is accepted, unchanged, under looser ones.
std::string FuzzProtocol(const std::uint8_t* data, std::size_t size);

// mp::Validate and mp::Cursor (common/msgpack_read.h) against msgpack-c's
// unpack under the same limits: the same objects accepted, ending at the
// same byte, read as the same tree (the same values, strings at the same
// addresses); what msgpack-c refuses for a limit refused for the same
// limit unless for a structural fault, and what it finds truncated or
// invalid refused as malformed. FuzzProtocol runs it too. msgpack-c
// reserves a container's elements when it reads the header: keep
// max_array and max_map small enough for that (the codec's are 65544).
std::string CheckMsgpackRead(const std::uint8_t* data, std::size_t size,
                             const mp::ReadLimits& limits);

// Limits that let ext through and that a few bytes break, each of them.
mp::ReadLimits TightReadLimits();

// prom::ParsePromText with the autoscaler's (default) limits, and with tight
// ones. Checks the counters and limits, the name index, the query methods
// against a linear scan, and that writing the samples and families back out
// as exposition text and parsing that gives the same page.
std::string FuzzPromText(const std::uint8_t* data, std::size_t size);

// prom::ParseQueryResponse with the autoscaler's (default) limits. Checks
// ok() against the documented shapes (vector or scalar, a scalar is one
// unlabelled sample) and that writing a successful result back out as an
// API response and parsing it again gives the same result.
std::string FuzzPromApi(const std::uint8_t* data, std::size_t size);

}  // namespace fleet::fuzz

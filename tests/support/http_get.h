// A bare HTTP/1.0 GET for tests that read /metrics pages on 127.0.0.1,
// independent of the code under test.
#pragma once

#include <string>

namespace fleet::testing {

// Returns the body of http://127.0.0.1:PORT/path, or "" on any failure.
std::string HttpGet(const std::string& url);

}  // namespace fleet::testing

// A bare HTTP/1.0 GET for tests that read /metrics pages on 127.0.0.1,
// independent of the code under test.
#pragma once

#include <string>

namespace fleet::testing {

struct HttpReply {
  int status = 0;       // 0: no response (refused, timed out, garbage)
  std::string headers;  // the status line and headers, as received
  std::string body;
};

// GET http://127.0.0.1:PORT/path with `extra_headers` (complete lines, each
// ending in \r\n, e.g. "Authorization: Basic ...\r\n").
HttpReply HttpFetch(const std::string& url, const std::string& extra_headers = "");

// Returns the body of http://127.0.0.1:PORT/path, or "" on any failure.
std::string HttpGet(const std::string& url);

}  // namespace fleet::testing

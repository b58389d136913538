// HTTP basic-auth credentials for /metrics, on both sides: the programs that
// serve /metrics (--metrics-auth-file) and the autoscaler that reads them
// (--metrics-source-auth-file). Credentials come only from a file, never
// from the command line, where every user of the machine could read them.
//
// The file holds one line "user:password" (the user has no ':'; the
// password may), with or without a final newline, and only its owner may
// read it: mode 0600 or 0400.
#pragma once

#include <string>
#include <string_view>

namespace fleet {

struct BasicAuth {
  std::string username;
  std::string password;

  // True when both match. Constant time: the time depends on the lengths
  // only, never on where the first differing byte is. Thread-safe.
  bool Matches(std::string_view username, std::string_view password) const;
};

// Reads a credentials file. Throws std::runtime_error naming the file and
// what is wrong: missing or unreadable, not a regular file, a mode other
// than 0600 or 0400 (with the chmod that fixes it), empty, more than one
// line, no ':', an empty user or password, or over 4 KiB.
BasicAuth ReadBasicAuthFile(const std::string& path);

// a == b in a time that depends on the lengths only.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace fleet

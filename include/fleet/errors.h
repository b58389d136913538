// Errors fleet's SDK throws that a program may want to tell apart.
// This header needs nothing but the standard library.
#pragma once

#include <stdexcept>

namespace fleet {

// The broker refused this client's handshake for good: its key is not on
// the broker's allowlist, it speaks plain TCP to a CURVE broker (or CURVE
// to a plain one), or it holds the wrong server key. Retrying does not
// help; what() says which and what to change. (Its text starts with
// "authentication failed", or "handshake ... failed" for a peer that is
// not speaking fleet's protocol at all.)
class AuthenticationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fleet

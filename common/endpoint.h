// Checking the addresses a program is given before it uses them, so that a
// typo is a start-up error naming the flag and the value, not a socket that
// binds a random port (libzmq reads tcp://*:99999 as "any port") or a bare
// "Invalid argument" from zmq_connect.
//
// Pure functions; thread-safe.
#pragma once

#include <string>

namespace fleet {

enum class EndpointUse {
  kBind,     // the program binds it: a tcp port may be * or 0 (any free one)
  kConnect,  // the program connects to it: a real host and port
};

// Checks a ZeroMQ endpoint given as `flag` (named in the message, e.g.
// "--frontend" or "ClientOptions::endpoint"):
//   tcp://HOST:PORT  HOST a name, an IPv4 address or [IPv6]; * (every
//                    interface) only to bind. PORT 1..65535; to bind also
//                    * or 0 for a free one.
//   ipc://PATH       a non-empty path (ipc://* to bind picks one).
// inproc:// is refused (it reaches only sockets of the same process's
// ZeroMQ context, never another fleet program), and so is every other
// scheme. Throws std::invalid_argument naming the flag, the value, what is
// wrong and an example.
void CheckEndpoint(const std::string& flag, const std::string& endpoint, EndpointUse use);

// Checks a listen address ADDRESS:PORT with a numeric address, as the
// /metrics servers take it (0.0.0.0:9750, 127.0.0.1:0, [::]:9750,
// [::1]:9750; port 0..65535, 0 picks a free one). A host alone or a port
// alone is refused rather than guessed. Throws std::invalid_argument naming
// `flag`, the value and what is wrong.
void CheckListenAddress(const std::string& flag, const std::string& address);

}  // namespace fleet

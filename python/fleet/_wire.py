"""Wire constants and helpers shared by the producer client and the handler.

The numbers and rules come from docs/protocol.md (broker <-> producer) and
docs/handler-protocol.md (fleet-worker <-> handler); only this module and the
two that use it know them.
"""

import os

import msgpack

VERSION = 1

# Commands (docs/protocol.md, section 3).
SUBMIT, ACK, RESULT, FETCH = 1, 2, 3, 4
OBJECT_REQUEST, OBJECT_REPLY = 5, 6
CONTROL, CONTROL_REPLY, WORKERS_REPLY, STATS_REPLY = 30, 31, 32, 33
ERROR = 40

# Outcomes and error codes (section 7).
OK, FAILED, UNKNOWN = 0, 1, 2
CODES = {
    0: "ok", 1: "malformed", 2: "unsupported_version", 3: "unknown_command",
    4: "too_large", 5: "queue_full", 6: "unknown_worker", 7: "busy",
    8: "blacklisted", 9: "duplicate_worker", 10: "invalid_argument",
    11: "frames", 12: "not_retiring", 13: "disk_full",
}
QUEUE_FULL = 5
DISK_FULL = 13

# Limits (section 8): ids and queue names, items per list.
MAX_ID_BYTES = 256
MAX_ITEMS = 65536
# A SUBMIT is cut at this many batches or this many payload bytes; a larger
# batch (at most --max-batch-bytes, 16 MiB by default) travels alone. The
# broker's --max-message-bytes defaults to --max-batch-bytes + 68 KiB, so
# both fit: 8 MiB of payloads plus 4096 ids and queues of at most 256 bytes
# (2 MiB), or one batch of the largest size with its envelope.
SUBMIT_MAX_BATCHES = 4096
SUBMIT_MAX_BYTES = 8 << 20


def pack(message):
    return msgpack.packb(message, use_bin_type=True)


def object_reply(token, status, total, data, error):
    """OBJECT_REPLY [1, 6, token, status, total, data, error] as one frame,
    `data` (any bytes-like, a chunk of MiBs) copied once into it."""
    n = len(data)
    if n < 1 << 8:
        bin_head = b"\xc4" + n.to_bytes(1, "big")
    elif n < 1 << 16:
        bin_head = b"\xc5" + n.to_bytes(2, "big")
    else:
        bin_head = b"\xc6" + n.to_bytes(4, "big")
    head = b"\x97" + b"".join(pack(v) for v in (VERSION, OBJECT_REPLY, token, status, total))
    return b"".join((head, bin_head, data, pack(error)))


def unpack(frame):
    """Decodes one broker frame; ids and texts come back as str."""
    return msgpack.unpackb(frame, raw=False, unicode_errors="surrogateescape",
                           strict_map_key=False)


def code_name(code):
    return CODES.get(code, "code %s" % code)


def check_endpoint(endpoint, what="endpoint"):
    """Checks an endpoint to connect to, as the C++ programs do
    (common/endpoint.h): tcp://HOST:PORT with a host name, an IPv4 address
    or [IPv6] and a port 1..65535, or ipc://PATH. Returns it; raises
    ValueError naming `what`, the value and what is wrong."""
    def bad(why):
        raise ValueError("%s %r: %s; want tcp://HOST:PORT or ipc://PATH, e.g. "
                         "tcp://127.0.0.1:5555" % (what, endpoint, why))
    if not isinstance(endpoint, str):
        raise ValueError("%s must be a str like tcp://127.0.0.1:5555, not %s"
                         % (what, type(endpoint).__name__))
    if not endpoint:
        bad("empty")
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        bad("no scheme (tcp:// or ipc://)")
    if scheme == "ipc":
        if not rest or rest == "*":
            bad("no path after ipc://")
        return endpoint
    if scheme == "inproc":
        bad("inproc:// reaches only sockets in the same process, never a fleet broker")
    if scheme != "tcp":
        bad("unsupported scheme '%s://'" % scheme)
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0 or rest[close + 1:close + 2] != ":":
            bad("no port after the IPv6 address (tcp://[ADDRESS]:PORT)")
        host, port = rest[1:close], rest[close + 2:]
        import socket
        try:
            socket.inet_pton(socket.AF_INET6, host)
        except OSError:
            bad("'%s' is not an IPv6 address" % host)
    else:
        host, sep, port = rest.rpartition(":")
        if not sep:
            bad("no port (tcp://HOST:PORT)")
        if not host:
            bad("no host before the port")
        if host == "*":
            bad("* is not a host to connect to (the broker's address, e.g. 127.0.0.1)")
        if ":" in host:
            bad("'%s' is not a host (an IPv6 address goes in brackets: tcp://[::1]:PORT)"
                % host)
        if not all(c.isascii() and (c.isalnum() or c in ".-_") for c in host):
            bad("'%s' is not a host name or address" % host)
    if not port:
        bad("no port after the host")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        bad("port '%s' is out of range (1..65535)" % port)
    return endpoint


def check_secret_key_mode(path, mode):
    """Raises ValueError when group or others have any access to the secret
    key file `path` (mode & 0o077), naming the file, its mode and the fix."""
    perms = mode & 0o7777
    if perms & 0o077:
        raise ValueError("secret key file %s has mode %04o: group or others may read it; "
                         "make it readable by its owner only: chmod 600 %s"
                         % (path, perms, path))


def read_key_file(path, need_secret):
    """Reads a key file written by `fleet-ctl keygen` (or a line of Z85).

    Returns (public, secret) as bytes (secret is None for a .pub file).
    Raises ValueError saying what is wrong with the file, and for a file
    that holds a secret key and that group or others may read (as the C++
    programs do)."""
    public = secret = None
    with open(path, "r", encoding="ascii") as f:
        # The mode of the file read, not of the path (symlinks are
        # followed: Docker and Kubernetes secrets are links).
        mode = os.fstat(f.fileno()).st_mode
        text = f.read()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" in line:
            key, _, value = line.partition("=")
            key, value = key.strip(), value.strip()
        else:
            key, value = "public", line
        if key not in ("public", "secret") or len(value) != 40:
            raise ValueError("%s: expected \"public = <40 Z85 characters>\" or "
                             "\"secret = ...\", got %r" % (path, raw[:60]))
        if key == "public":
            public = value.encode()
        else:
            secret = value.encode()
    if need_secret and secret is None:
        raise ValueError("%s: no secret key (give the .key file from "
                         "`fleet-ctl keygen`, not the .pub)" % path)
    if public is None and secret is None:
        raise ValueError("%s: no key in the file" % path)
    if secret is not None:
        check_secret_key_mode(path, mode)
        import zmq
        derived = zmq.curve_public(secret)
        if public is None:
            public = derived
        elif public != derived:
            raise ValueError("%s: the public key does not belong to the secret key" % path)
    return public, secret


def apply_curve(sock, curve):
    """Makes `sock` a CURVE client. `curve` is None (plaintext), or a mapping
    with "server_key" (the broker's .pub file or its Z85 text) and "key" (this
    client's .key file from `fleet-ctl keygen`), or a (server_key, key) pair."""
    if curve is None:
        return
    if isinstance(curve, (tuple, list)):
        server, mine = curve
    else:
        unknown = set(curve) - {"server_key", "key"}
        if unknown:
            raise ValueError("curve: unknown keys %s (expected server_key and key)"
                             % sorted(unknown))
        server, mine = curve.get("server_key"), curve.get("key")
    if not server or not mine:
        raise ValueError("curve needs both server_key and key")
    if isinstance(server, bytes) or (len(server) == 40 and not os.path.exists(server)):
        server_public = server if isinstance(server, bytes) else server.encode()
    else:
        server_public, _ = read_key_file(server, need_secret=False)
    public, secret = read_key_file(mine, need_secret=True)
    sock.curve_serverkey = server_public
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def control_endpoint_for(frontend):
    """fleet's default layout puts the control socket two ports above the
    frontend (5555 -> 5557). Returns None when the port is not a number."""
    head, sep, port = frontend.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return "%s:%d" % (head, int(port) + 2)

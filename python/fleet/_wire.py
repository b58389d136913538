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


def unpack(frame):
    """Decodes one broker frame; ids and texts come back as str."""
    return msgpack.unpackb(frame, raw=False, unicode_errors="surrogateescape",
                           strict_map_key=False)


def code_name(code):
    return CODES.get(code, "code %s" % code)


def read_key_file(path, need_secret):
    """Reads a key file written by `fleet-ctl keygen` (or a line of Z85).

    Returns (public, secret) as bytes (secret is None for a .pub file).
    Raises ValueError saying what is wrong with the file."""
    public = secret = None
    with open(path, "r", encoding="ascii") as f:
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

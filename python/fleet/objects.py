"""Large arguments shared by digest: what lets a 40 MB array cross the wire
once per worker instead of once per call.

The producer's side (fleet.joblib) pickles each call with a `Sharing`: an
argument at or above its threshold (a numpy array, bytes, or any top-level
argument whose pickle is that large) is pickled once on its own into an
*object*, kept in this process's `STORE`, and replaced in the call by a
small reference `("fleet.object", digest, size)`. A worker's handler
(fleet.calls) that meets the reference fetches the object in chunks from
the producer of the batch it runs, through fleet-worker and the broker
(docs/protocol.md, section 5a), checks its digest, and keeps it in a
bounded cache for later calls. An object is held in the store while a
batch that names it is out and until the Parallel call that shared it
ends.

An object's bytes (the *blob*) are a pickle (protocol 5) with its large
buffers out of band, so that neither side copies an array to send or load
it:

    b"fob1" | nbuf u32 | header_len u64 | buf_len u64 * nbuf | header | bufs...

(integers little-endian). The digest is BLAKE2b (32 bytes) over all of it.
The handler loads it with pickle.loads(header, buffers=...) over read-only
views of the bytes it received, so a shared array arrives read-only, as
loky's memory-mapped arrays do.
"""

import bisect
import hashlib
import pickle
import struct
import sys
import threading

MAGIC = b"fob1"
DIGEST_BYTES = 32
PID_TAG = "fleet.object"
DEFAULT_THRESHOLD = 1 << 20   # 1 MiB

# Statuses of OBJECT_REPLY / OBJECT_DATA / the handler's "object" answers
# (docs/protocol.md, section 7).
OK, UNKNOWN_OBJECT, PRODUCER_GONE, UNKNOWN_BATCH, BUSY, TIMEOUT, BAD_REQUEST, UNAVAILABLE = range(8)
STATUS_NAMES = ("ok", "unknown_object", "producer_gone", "unknown_batch", "busy", "timeout",
                "bad_request", "unavailable")


def status_name(status):
    return STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else "status %d" % status


def new_hash():
    return hashlib.blake2b(digest_size=DIGEST_BYTES)


class Blob:
    """One object's bytes as a list of segments (no copy of the buffers),
    with its digest; read(offset, length) serves a chunk."""

    __slots__ = ("digest", "total", "_segments", "_starts", "refs")

    def __init__(self, segments):
        self._segments = [memoryview(s).cast("B") for s in segments]
        self._starts = []
        pos = 0
        h = new_hash()
        for s in self._segments:
            self._starts.append(pos)
            pos += s.nbytes
            h.update(s)
        self.total = pos
        self.digest = h.digest()
        self.refs = 0

    def read(self, offset, length):
        """Bytes [offset, offset + length) (a bytes-like: bytes or a
        memoryview)."""
        end = min(self.total, offset + length)
        if offset >= end:
            return b""
        i = bisect.bisect_right(self._starts, offset) - 1
        parts = []
        while offset < end:
            seg, start = self._segments[i], self._starts[i]
            stop = min(end, start + seg.nbytes)
            parts.append(seg[offset - start:stop - start])
            offset = stop
            i += 1
        # A view when the chunk lies in one segment: the reply copies it once.
        return parts[0] if len(parts) == 1 else b"".join(parts)


# A payload that names objects starts with a list of them, so the handler
# can start fetching before it unpickles (imports take time): magic, u32
# count, then per object its 32-byte digest and u64 size; then the pickle.
NAMES_MAGIC = b"fon1"
_NAME = struct.Struct("<%dsQ" % DIGEST_BYTES)


def name_objects(payload, sizes):
    """`payload` with the list of the objects it names in front (`sizes`:
    digest -> size); unchanged when it names none."""
    if not sizes:
        return payload
    return b"".join([NAMES_MAGIC, struct.pack("<I", len(sizes))] +
                    [_NAME.pack(d, n) for d, n in sorted(sizes.items())] + [payload])


def named_objects(payload):
    """([(digest, size)], the pickle as a memoryview) of a payload."""
    view = memoryview(payload)
    if bytes(view[:4]) != NAMES_MAGIC:
        return [], view
    (count,) = struct.unpack_from("<I", view, 4)
    pos = 8
    names = []
    for _ in range(count):
        names.append(_NAME.unpack_from(view, pos))
        pos += _NAME.size
    return names, view[pos:]


def encode(obj):
    """The object's blob (cloudpickle, protocol 5, buffers out of band)."""
    import cloudpickle
    buffers = []
    header = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    prefix = MAGIC + struct.pack("<IQ", len(raws), len(header)) + b"".join(
        struct.pack("<Q", r.nbytes) for r in raws)
    return Blob([prefix, header] + raws)


def decode(data):
    """The object a blob holds (`data`: bytes-like). Raises ValueError when
    it is not a blob."""
    view = memoryview(data).toreadonly()
    if view.nbytes < 16 or bytes(view[:4]) != MAGIC:
        raise ValueError("not a fleet object (bad magic)")
    nbuf, header_len = struct.unpack_from("<IQ", view, 4)
    pos = 16
    lens = struct.unpack_from("<%dQ" % nbuf, view, pos)
    pos += 8 * nbuf
    header = view[pos:pos + header_len]
    pos += header_len
    bufs = []
    for n in lens:
        bufs.append(view[pos:pos + n])
        pos += n
    if pos != view.nbytes:
        raise ValueError("not a fleet object (sizes do not add up)")
    return pickle.loads(header, buffers=bufs)


class Store:
    """The objects this process serves, by digest, with a count of who
    needs each (the Parallel calls that shared it, and batches out)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._blobs = {}
        self.bytes_served = 0
        self.requests = 0

    def add(self, blob):
        """Holds `blob` (or the equal one already held) once more; returns
        the one held."""
        with self._lock:
            held = self._blobs.get(blob.digest)
            if held is None:
                self._blobs[blob.digest] = held = blob
            held.refs += 1
            return held

    def hold(self, digests):
        with self._lock:
            for d in digests:
                self._blobs[d].refs += 1

    def release(self, digests):
        with self._lock:
            for d in digests:
                b = self._blobs.get(d)
                if b is not None:
                    b.refs -= 1
                    if b.refs <= 0:
                        del self._blobs[d]

    def __len__(self):
        with self._lock:
            return len(self._blobs)

    def __contains__(self, digest):
        with self._lock:
            return digest in self._blobs

    def read(self, digest, offset, length):
        """(status, total, data, error) for an OBJECT_REQUEST."""
        with self._lock:
            blob = self._blobs.get(digest)
        self.requests += 1
        if blob is None:
            return (UNKNOWN_OBJECT, 0, b"",
                    "this producer does not hold object %s (the Parallel call that shared "
                    "it has ended)" % digest.hex()[:16])
        if offset > blob.total:
            return (BAD_REQUEST, 0, b"", "offset %d is past the object's %d bytes"
                    % (offset, blob.total))
        data = blob.read(offset, length)
        self.bytes_served += len(data)
        return OK, blob.total, data, ""


STORE = Store()


class Sharing:
    """The objects one Parallel call shares: pickles its calls with large
    arguments replaced by references, holds every object it made in STORE
    until close(). Thread-safe (joblib dispatches from its own thread and
    from result callbacks)."""

    def __init__(self, threshold=DEFAULT_THRESHOLD, store=None):
        self.threshold = threshold
        self.store = store if store is not None else STORE
        self._lock = threading.Lock()
        self._memo = {}       # id(obj) -> (obj, pid): obj kept so its id stays its own
        self._digests = []    # one store reference each, dropped by close()
        self._checked = set()  # ids of top-level arguments found small on their own
        self.shared_bytes = 0

    def _share(self, obj):
        entry = self._memo.get(id(obj))
        if entry is not None:
            return entry[1]
        blob = self.store.add(encode(obj))
        pid = (PID_TAG, blob.digest, blob.total)
        self._memo[id(obj)] = (obj, pid)
        self._digests.append(blob.digest)
        self.shared_bytes += blob.total
        return pid

    def dumps(self, work, candidates=()):
        """(payload, digests it names). `candidates`: top-level arguments
        pickled on their own when the payload would otherwise be at or
        above the threshold."""
        import cloudpickle
        with self._lock:
            for attempt in (0, 1):
                p = _pickler_class()(self)
                p.dump(work)
                payload = p.file.getvalue()
                if attempt or len(payload) < self.threshold or not candidates:
                    break
                grew = False
                for obj in candidates:
                    if id(obj) in self._memo or id(obj) in self._checked or _small(obj):
                        continue
                    try:
                        size = len(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
                    except Exception:
                        continue   # the call's own pickling says what is wrong
                    if size >= self.threshold:
                        self._share(obj)
                        grew = True
                    else:
                        self._checked.add(id(obj))
                if not grew:
                    break
            self.store.hold(p.used)
            return name_objects(payload, p.sizes), p.used

    def close(self):
        """The Parallel call ended: its objects go once no batch needs them."""
        with self._lock:
            digests, self._digests = self._digests, []
            self._memo.clear()
            self._checked.clear()
        self.store.release(digests)


_PICKLER = None


def _pickler_class():
    """cloudpickle's pickler, with large arrays and bytes (and what the
    Sharing already shares) replaced by references (made once: cloudpickle
    is imported on first use only)."""
    global _PICKLER
    if _PICKLER is not None:
        return _PICKLER
    import io
    import cloudpickle

    class _Pickler(cloudpickle.CloudPickler):
        def __init__(self, sharing):
            self.file = io.BytesIO()
            super().__init__(self.file, protocol=pickle.HIGHEST_PROTOCOL)
            self.sharing = sharing
            self.used = set()
            self.sizes = {}   # digest -> size of what it names
            np = sys.modules.get("numpy")
            self.ndarray = np.ndarray if np is not None else None

        def persistent_id(self, obj):
            sharing = self.sharing
            entry = sharing._memo.get(id(obj))
            if entry is not None:
                self.used.add(entry[1][1])
                self.sizes[entry[1][1]] = entry[1][2]
                return entry[1]
            t = type(obj)
            if t is bytes or t is bytearray:
                big = len(obj) >= sharing.threshold
            elif self.ndarray is not None and isinstance(obj, self.ndarray):
                big = obj.nbytes >= sharing.threshold
            else:
                return None
            if not big:
                return None
            pid = sharing._share(obj)
            self.used.add(pid[1])
            self.sizes[pid[1]] = pid[2]
            return pid

    _PICKLER = _Pickler
    return _PICKLER


def _small(obj):
    return obj is None or type(obj) in (bool, int, float, complex, str)


class Corrupt(Exception):
    """An object whose bytes do not match its digest: refused, not kept."""

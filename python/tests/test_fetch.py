"""fleet.handler's object fetch against a scripted worker on real pipes:
chunks read straight into the object's buffer, answers shortened on the
way, busy answers asked again, stale answers dropped, prefetched chunks
collected, and the payload's list of the objects it names."""

import os
import struct
import threading

import msgpack
import pytest

from fleet import handler, objects


class FakeWorker:
    """Answers the handler's gets from `blob`, at most `cap` bytes each;
    the first get is answered busy when `busy_first`, and every answer is
    preceded by one for a tag nobody asked for."""

    def __init__(self, blob, cap=1 << 30, busy_first=False):
        self.blob, self.cap, self.busy_first = blob, cap, busy_first
        self.gets = []
        self.to_handler_r, self.to_handler_w = os.pipe()
        self.from_handler_r, self.from_handler_w = os.pipe()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def send(self, message):
        body = msgpack.packb(message, use_bin_type=True)
        os.write(self.to_handler_w, struct.pack(">I", len(body)) + body)

    def run(self):
        buf = b""
        while True:
            data = os.read(self.from_handler_r, 65536)
            if not data:
                return
            buf += data
            while len(buf) >= 4:
                (n,) = struct.unpack(">I", buf[:4])
                if len(buf) < 4 + n:
                    break
                name, tag, digest, off, length = msgpack.unpackb(buf[4:4 + n])
                buf = buf[4 + n:]
                assert name == "get"
                self.gets.append((tag, off, length))
                self.send(["object", 10 ** 9 + tag, 0, len(self.blob), off, b"stale", ""])
                if self.busy_first and len(self.gets) == 1:
                    self.send(["object", tag, 4, 0, off, b"", "busy"])
                    continue
                chunk = self.blob[off:off + min(length, self.cap)]
                self.send(["object", tag, 0, len(self.blob), off, chunk, ""])

    def close(self):
        for fd in (self.to_handler_w, self.from_handler_w):
            os.close(fd)


@pytest.fixture
def serving(monkeypatch):
    """Sets fleet.handler up as serve() does while a batch runs."""
    made = []

    def make(blob, **kw):
        w = FakeWorker(blob, **kw)
        made.append(w)
        monkeypatch.setenv("FLEET_HANDLER_FEATURES", "objects")
        monkeypatch.setattr(handler, "_pipes", handler._Pipes(w.to_handler_r, w.from_handler_w))
        monkeypatch.setattr(handler, "_current", ("b-1", 1, "default"))
        return w

    yield make
    handler.forget_fetches()
    handler._by_tag.clear()
    for w in made:
        w.close()


def test_an_object_arrives_whole_in_chunks_shortened_on_the_way(serving):
    blob = os.urandom(5 * handler._FETCH_CHUNK + 12345)
    w = serving(blob, cap=700_000, busy_first=True)
    got = handler.fetch_object(b"d" * 32, len(blob), timeout=20)
    assert bytes(memoryview(got)) == blob
    # Each shortened answer was asked again from where it ended.
    offsets = [off for _, off, _ in w.gets]
    assert offsets[0] == 0 and offsets.count(0) == 2   # busy, then asked again
    assert all(length <= handler._FETCH_CHUNK for _, _, length in w.gets)
    assert len(w.gets) >= len(blob) // 700_000
    assert not handler._by_tag   # every request answered


def test_prefetched_chunks_are_collected_by_the_fetch(serving):
    blob = os.urandom(3 * handler._FETCH_CHUNK)
    w = serving(blob)
    handler.prefetch_objects([(b"p" * 32, len(blob))])
    assert len(w.gets) <= handler._PREFETCH
    got = handler.fetch_object(b"p" * 32, len(blob), timeout=20)
    assert bytes(memoryview(got)) == blob
    assert len(w.gets) == 3   # nothing asked twice


def test_a_frame_of_another_layout_still_reads():
    body = msgpack.packb(["object", 7, 0, 10, 0, b"0123456789", ""], use_bin_type=True)
    frame = bytearray(struct.pack(">I", len(body)) + body)
    assert handler._object_head(frame, 4, len(body), len(body)) == (7, 0, 10, 0, 10, 14)
    assert handler._object_head(frame, 4, 5, len(body)) is handler._MORE
    batch = msgpack.packb(["batch", "b", b"x", 1, "q"], use_bin_type=True)
    assert handler._object_head(bytearray(batch), 0, len(batch), len(batch)) is None


def test_a_payload_lists_the_objects_it_names_in_front():
    import numpy as np
    X = np.arange(300000, dtype=np.float64)
    sharing = objects.Sharing(threshold=1 << 20)
    used = ()
    try:
        payload, used = sharing.dumps(("calls", [(len, (X,), {})], None, None))
        names, pickled = objects.named_objects(payload)
        assert [d for d, _ in names] == list(used)
        assert names[0][1] == objects.STORE._blobs[names[0][0]].total
        assert objects.named_objects(b"\x80\x05plain")[0] == []
    finally:
        objects.STORE.release(used)   # the hold a submitted batch would drop
        sharing.close()
    assert len(objects.STORE) == 0

"""Shared plumbing for the peer benchmarks (celery_bench.py, dask_bench.py).

Only the standard library is used here, so that a missing Debian package is
reported by the benchmark itself with a clear message (exit code 3).

What lives here:
  * command line parsing common to both peers (three modes, same flags),
  * a process registry that tears down every child process group on normal
    exit, on an exception, and on SIGINT / SIGTERM / SIGHUP,
  * a private redis-server on a free 127.0.0.1 port, in a temporary
    directory, with persistence switched off,
  * nearest-rank percentiles and the one-JSON-line result printer.
"""

import argparse
import atexit
import ctypes
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3"  # Debian's interpreter: it sees python3-celery etc.

EXIT_FAIL = 1       # the benchmark ran but failed (e.g. a task was lost)
EXIT_USAGE = 2      # argparse's own code for bad arguments
EXIT_UNAVAILABLE = 3  # the peer cannot run here; the orchestrator skips it


def reexec_with_debian_python(modules):
    """`python3` on PATH may be another interpreter (pyenv, venv) that does
    not see Debian's python3-* packages. If one of `modules` does not import
    here, run this same command again with /usr/bin/python3 (once)."""
    import importlib
    try:
        for m in modules:
            importlib.import_module(m)
        return
    except Exception:
        pass
    here = os.path.realpath(sys.executable or "")
    if (os.environ.get("FLEET_PEER_REEXEC") or not os.path.exists(PYTHON)
            or here == os.path.realpath(PYTHON)):
        return  # the benchmark reports the missing package itself
    os.environ["FLEET_PEER_REEXEC"] = "1"
    sys.stderr.flush()
    os.execv(PYTHON, [PYTHON, os.path.abspath(sys.argv[0])] + sys.argv[1:])


def log(msg):
    """Human progress: always stderr, stdout is reserved for the JSON line."""
    sys.stderr.write("[%s %s] %s\n" % (os.path.basename(sys.argv[0]),
                                       time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


class BenchError(Exception):
    """A failure that ends the run with EXIT_FAIL and a one-line message."""


class Interrupted(BaseException):
    """Raised from the signal handler so that finally-blocks run."""

    def __init__(self, signum):
        super().__init__("interrupted by signal %d" % signum)
        self.signum = signum


# --------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """preexec_fn: the child gets SIGKILL if this benchmark dies (even by
    SIGKILL), so a crashed run leaves no server behind. Best effort."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # pragma: no cover - never fatal
        pass


def _sweep_stale(prefix):
    """Remove temp dirs left by a run that was SIGKILLed (its pid is gone)."""
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except PermissionError:
            pass


class Children:
    """Every server or worker we start, each in its own process group
    (session), so that one killpg reaches its whole tree (Celery's prefork
    children, Dask's nannies and their worker processes)."""

    def __init__(self):
        self.procs = []        # (name, Popen)
        self.tmpdirs = []
        self.mp_procs = []     # multiprocessing.Process producers
        self.on_close = []     # client clean-ups, run before servers stop
        self._closed = False
        self.term_grace = 1.5  # seconds between the stop signal and SIGKILL

    def spawn(self, name, argv, env=None, cwd=None, stdout=None, stderr=None,
              term_signal=signal.SIGTERM):
        p = subprocess.Popen(argv, env=env, cwd=cwd,
                             stdin=subprocess.DEVNULL,
                             stdout=stdout if stdout is not None else subprocess.DEVNULL,
                             stderr=stderr if stderr is not None else subprocess.DEVNULL,
                             start_new_session=True,
                             preexec_fn=_die_with_parent)
        p.term_signal = term_signal
        self.procs.append((name, p))
        log("started %s (pid %d)" % (name, p.pid))
        return p

    def tmpdir(self, prefix):
        _sweep_stale(prefix)
        d = tempfile.mkdtemp(prefix="%s%d-" % (prefix, os.getpid()))
        self.tmpdirs.append(d)
        return d

    def check_alive(self):
        for name, p in self.procs:
            rc = p.poll()
            if rc is not None:
                raise BenchError("%s (pid %d) exited early with code %s"
                                 % (name, p.pid, rc))

    @staticmethod
    def _killpg(pid, sig):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _group_alive(pgid):
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def close(self):
        if self._closed:
            return
        self._closed = True
        # Teardown must not itself be cut short by a second Ctrl-C / TERM.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                signal.signal(s, signal.SIG_IGN)
            except (ValueError, OSError):
                pass
        for fn in self.on_close:
            try:
                fn()
            except Exception as e:
                log("client clean-up: %s" % e)
        # Producers first (they hold client connections), then servers.
        for mp in self.mp_procs:
            try:
                if mp.is_alive():
                    mp.terminate()
                mp.join(3)
                if mp.is_alive():
                    mp.kill()
                    mp.join(2)
            except Exception:
                pass
        # Newest first: workers stop while their broker is still there, then
        # redis. SIGTERM (Celery: SIGQUIT, cold shutdown) to the leader (Dask: graceful
        # close; redis: exit without saving), then SIGKILL to the whole group
        # so that no pool child or nanny survives.
        for name, p in reversed(self.procs):
            t = time.monotonic()
            try:
                p.send_signal(p.term_signal)
            except (ProcessLookupError, OSError):
                pass
            try:
                p.wait(self.term_grace)
            except subprocess.TimeoutExpired:
                log("%s did not stop on %s within %g s: SIGKILL"
                    % (name, signal.Signals(p.term_signal).name, self.term_grace))
            self._killpg(p.pid, signal.SIGKILL)
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + 3.0
            while self._group_alive(p.pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            log("stopped %s in %.2f s" % (name, time.monotonic() - t))
        for d in self.tmpdirs:
            shutil.rmtree(d, ignore_errors=True)
        left = [p.pid for _n, p in self.procs if self._group_alive(p.pid)]
        if left:
            log("WARNING: process groups still alive: %s" % left)
        else:
            log("teardown complete: no child process left")


def install_signal_handlers():
    def handler(signum, _frame):
        # Ignore further signals while tearing down.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def run_main(system, body):
    """Run body(children) with teardown on every path; map errors to exit
    codes; print the result dict as the last stdout line."""
    children = Children()
    atexit.register(children.close)
    install_signal_handlers()
    rc = 0
    result = None
    try:
        result = body(children)
    except Interrupted as e:
        log("%s: %s" % (system, e))
        rc = 128 + e.signum
    except Unavailable as e:
        log("%s: not available: %s" % (system, e))
        rc = EXIT_UNAVAILABLE
    except BenchError as e:
        log("%s: FAILED: %s" % (system, e))
        rc = EXIT_FAIL
    except Exception as e:  # unexpected: show the type too
        import traceback
        traceback.print_exc(file=sys.stderr)
        log("%s: FAILED: %s: %s" % (system, type(e).__name__, e))
        rc = EXIT_FAIL
    finally:
        children.close()
    if result is not None:
        # A run that lost tasks still prints its figures, but fails.
        if result.get("lost", 0):
            log("%s: FAILED: %d task(s) lost" % (system, result["lost"]))
            rc = rc or EXIT_FAIL
        sys.stdout.write(json.dumps(result, sort_keys=False) + "\n")
        sys.stdout.flush()
    return rc


# --------------------------------------------------------------------------
# redis-server
# --------------------------------------------------------------------------

def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _redis_ping(port, timeout=0.5):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
            c.sendall(b"PING\r\n")
            return c.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(children, binary="redis-server"):
    """A private redis-server on 127.0.0.1:<free port>: no RDB, no AOF, its
    own temp dir. Returns the port. Retries if the port was taken meanwhile."""
    if shutil.which(binary) is None:
        raise Unavailable("redis-server not found (apt-get install -y redis-server)")
    d = children.tmpdir("fleet-peer-redis-")
    for attempt in range(5):
        port = free_port()
        logf = open(os.path.join(d, "redis-%d.log" % port), "wb")
        p = children.spawn("redis-server:%d" % port, [
            binary,
            "--bind", "127.0.0.1", "--port", str(port),
            "--protected-mode", "yes",
            "--save", "", "--appendonly", "no",
            "--dir", d, "--daemonize", "no",
            "--databases", "2", "--loglevel", "warning",
        ], stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if p.poll() is not None:
                break
            if _redis_ping(port):
                return port
            time.sleep(0.02)
        log("redis-server on port %d did not come up (attempt %d)" % (port, attempt + 1))
        children.procs.remove(("redis-server:%d" % port, p))
        Children._killpg(p.pid, signal.SIGKILL)
        p.wait(5)
    raise BenchError("could not start redis-server")


class Unavailable(Exception):
    """The peer cannot run on this machine: exit code 3."""


# --------------------------------------------------------------------------
# Arguments and figures
# --------------------------------------------------------------------------

def parse_args(system, description, extra=None):
    ap = argparse.ArgumentParser(
        prog=os.path.basename(sys.argv[0]),
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The last stdout line is one JSON object; progress goes to stderr.\n"
               "Exit codes: 0 ok, 1 failed (e.g. a task lost), 2 usage, "
               "3 %s not available here." % system)
    sub = ap.add_subparsers(dest="mode", metavar="MODE")
    sub.required = True

    def common(p):
        p.add_argument("--workers", type=int, default=1, metavar="K",
                       help="worker processes, one task at a time each (default 1)")
        p.add_argument("--timeout", type=float, default=None, metavar="SEC",
                       help="give up on outstanding results after this long "
                            "(default: derived from the workload)")
        p.add_argument("--warmup", type=int, default=300, metavar="N",
                       help="untimed warm-up tasks (default 300)")
        if extra:
            extra(p)

    t = sub.add_parser("throughput", help="echo tasks, everything in flight at once")
    common(t)
    t.add_argument("--size", type=int, default=100, metavar="B", help="payload bytes")
    t.add_argument("--count", type=int, default=5000, metavar="N", help="timed tasks")
    t.add_argument("--producers", type=int, default=1, metavar="P",
                   help="producer processes splitting N (default 1)")

    s = sub.add_parser("sleep", help="tasks that sleep --sleep-ms then return")
    common(s)
    s.add_argument("--sleep-ms", type=float, default=10.0, metavar="MS")
    s.add_argument("--count", type=int, default=2000, metavar="N")

    lat = sub.add_parser("latency", help="open-loop echo at a fixed rate")
    common(lat)
    lat.add_argument("--size", type=int, default=100, metavar="B")
    lat.add_argument("--rate", type=float, default=50.0, metavar="R",
                     help="offered tasks per second")
    lat.add_argument("--seconds", type=float, default=5.0, metavar="S",
                     help="length of the sending schedule")

    a = ap.parse_args()
    for name in ("workers", "count", "size", "producers"):
        v = getattr(a, name, None)
        if v is not None and v < (0 if name == "size" else 1):
            ap.error("--%s must be %s" % (name, ">= 0" if name == "size" else ">= 1"))
    if getattr(a, "rate", 1) <= 0 or getattr(a, "seconds", 1) <= 0:
        ap.error("--rate and --seconds must be > 0")
    if getattr(a, "sleep_ms", 0) < 0:
        ap.error("--sleep-ms must be >= 0")
    if a.warmup < 0:
        ap.error("--warmup must be >= 0")
    return a


def nearest_rank(sorted_vals, pct):
    """Nearest-rank percentile: the smallest value with at least pct % of
    the samples at or below it."""
    n = len(sorted_vals)
    if n == 0:
        return None
    rank = max(1, int(math.ceil(pct / 100.0 * n)))
    return sorted_vals[min(rank, n) - 1]


def latency_figures(lat_s):
    """Latencies in seconds -> dict of integer microseconds."""
    v = sorted(lat_s)
    us = lambda x: None if x is None else int(round(x * 1e6))
    return {
        "p50_us": us(nearest_rank(v, 50)),
        "p99_us": us(nearest_rank(v, 99)),
        "p999_us": us(nearest_rank(v, 99.9)),
        "max_us": us(v[-1] if v else None),
    }


def num(x):
    """10.0 -> 10 in the JSON, 2.5 stays 2.5."""
    return int(x) if float(x).is_integer() else x


def split_count(n, parts):
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def payload_bytes(size):
    # Printable, so that every serializer (json too) carries it unchanged.
    return (b"0123456789abcdef" * (size // 16 + 1))[:size]


def run_producer_processes(children, target, first_arg, count, producers, size, timeout,
                           ready_timeout):
    """Runs `producers` processes of target(first_arg, share, size, timeout,
    ready_q, go, out_q), splitting `count`; they start sending together.
    Each reports ("ok", start, end, missing, bad) or ("error", why).
    Returns (starts, ends, missing, bad)."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    ready_q, out_q, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    for share in split_count(count, producers):
        p = ctx.Process(target=target, daemon=True,
                        args=(first_arg, share, size, timeout, ready_q, go, out_q))
        p.start()
        children.mp_procs.append(p)
    for _ in range(producers):
        try:
            ready_q.get(timeout=ready_timeout)
        except Exception:
            raise BenchError("a producer process did not get ready in %d s" % ready_timeout)
    go.set()
    starts, ends, missing, bad = [], [], 0, 0
    for _ in range(producers):
        try:
            r = out_q.get(timeout=timeout + 30)
        except Exception:
            raise BenchError("a producer process did not report in time")
        if r[0] != "ok":
            raise BenchError("producer failed: %s" % r[1])
        starts.append(r[1])
        ends.append(r[2])
        missing += r[3]
        bad += r[4]
    return starts, ends, missing, bad


def throughput_result(system, args, producers, starts, ends, missing, bad):
    """The throughput JSON of a run; raises on a wrong or failed result."""
    if bad:
        raise BenchError("%d task(s) returned a wrong result or failed" % bad)
    seconds = max(ends) - min(starts)
    completed = args.count - missing  # rates count only tasks with a result
    res = {"system": system, "bench": "throughput", "handler": "echo",
           "size": args.size, "workers": args.workers, "producers": producers,
           "count": args.count, "seconds": round(seconds, 6),
           "batches_per_s": round(completed / seconds, 1) if seconds > 0 else None}
    if missing:
        res["lost"] = missing
    return res

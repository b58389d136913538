"""The seed's example end to end (docs/examples/gridsearch.py): GridSearchCV
over a 40 MB X under parallel_backend("fleet") with the autoscaler at
--min 0: the same result as loky, X relayed once per worker, and the pool
back at zero afterwards."""

import json
import subprocess

from fleet import control
from conftest import HEARTBEAT_MS, PYTHON, ROOT, wait_for

EXAMPLE = ROOT / "docs" / "examples" / "gridsearch.py"


def run_example(env, *args):
    r = subprocess.run([PYTHON, str(EXAMPLE), *args], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_gridsearch_from_zero_workers_matches_loky_and_ships_x_once_per_worker(fleet_env):
    fleet_env.broker("--heartbeat-ms", str(HEARTBEAT_MS), "--retire-linger-ms", "100")
    fleet_env.calls_autoscaler(max_workers=2)
    assert fleet_env.workers() == []
    loky = run_example(fleet_env.env, "--backend", "loky")
    on_fleet = run_example(fleet_env.env, "--backend", "fleet", "--broker", fleet_env.frontend,
                           "--control", fleet_env.control)
    assert on_fleet["best_params"] == loky["best_params"]
    assert on_fleet["best_score"] == loky["best_score"]
    # X (40 MB) crossed the broker once per worker that ran a fit, not once
    # per fit: the broker's counter of object bytes relayed to workers.
    sent = on_fleet["sent"]
    x_blob = sent["shared_bytes"]   # X alone: y (160 kB) travels with the calls
    assert on_fleet["x_bytes"] <= x_blob < on_fleet["x_bytes"] + 4096, sent
    counters = control.stats(fleet_env.control)[1]
    moved = counters["object_bytes"]
    if counters["workers_dead"] == 0:
        assert moved in (x_blob, 2 * x_blob), (moved, x_blob)
    else:
        # The machine stalled past the heartbeats: a worker declared dead
        # lost its batch (maybe mid-fetch) and its new handler fetched X
        # again. Still at most once more per such worker, never per fit.
        assert x_blob <= moved <= (2 + counters["workers_dead"]) * x_blob, (moved, counters)
    # The calls themselves: y and the folds' indices, well under one X.
    assert sent["batches"] >= 5 and sent["payload_bytes"] < 10_000_000, sent
    # And the pool goes back to zero.
    wait_for(lambda: fleet_env.workers() == [], 60, "the pool to go back to zero")

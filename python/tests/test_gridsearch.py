"""The seed's example end to end (docs/examples/gridsearch.py): GridSearchCV
over a 40 MB X under parallel_backend("fleet") with the autoscaler at
--min 0: the same result as loky, X relayed once per worker, and the pool
back at zero afterwards."""

import json
import subprocess

from fleet import control
from conftest import PYTHON, ROOT, wait_for

EXAMPLE = ROOT / "docs" / "examples" / "gridsearch.py"


def run_example(env, *args):
    r = subprocess.run([PYTHON, str(EXAMPLE), *args], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_gridsearch_from_zero_workers_matches_loky_and_ships_x_once_per_worker(fleet_env):
    fleet_env.broker("--heartbeat-ms", "200", "--retire-linger-ms", "100")
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
    moved = control.stats(fleet_env.control)[1]["object_bytes"]
    assert moved in (x_blob, 2 * x_blob), (moved, x_blob)
    # The calls themselves: y and the folds' indices, well under one X.
    assert sent["batches"] >= 5 and sent["payload_bytes"] < 10_000_000, sent
    # And the pool goes back to zero.
    wait_for(lambda: fleet_env.workers() == [], 60, "the pool to go back to zero")

#!/usr/bin/python3
"""The seed's example: scikit-learn's GridSearchCV on a fleet.

20 fits (4 alphas x 5 folds) of an SGDClassifier over a 40 MB X. The only
fleet-specific lines are the two around `search.fit`; X travels to each
worker once (fleet.joblib shares arguments of 1 MiB or more by digest).

    # a broker and an autoscaler whose workers run fleet.calls (README, "Python and joblib")
    python3 docs/examples/gridsearch.py --backend fleet --broker tcp://127.0.0.1:5555
    python3 docs/examples/gridsearch.py --backend loky        # joblib's default, to compare

--repeat N fits N times in this process (the first is cold, the rest warm).
Prints one line per fit and, last, a JSON object with best_params_,
best_score_ and the times.
"""

import argparse
import contextlib
import json
import sys
import time

import joblib
from sklearn.datasets import make_classification
from sklearn.linear_model import SGDClassifier
from sklearn.model_selection import GridSearchCV


def backend_context(args):
    if args.backend == "fleet":
        import fleet.joblib
        fleet.joblib.register()
        kw = {"broker": args.broker}
        if args.control:
            kw["control"] = args.control
        return joblib.parallel_backend("fleet", **kw), None
    if args.backend == "dask":
        from dask.distributed import Client, LocalCluster
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
        return joblib.parallel_backend("dask"), (client, cluster)
    if args.backend == "sequential":
        return joblib.parallel_backend("sequential"), None
    return contextlib.nullcontext(), None   # loky, joblib's default


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("fleet", "loky", "dask", "sequential"), default="fleet")
    ap.add_argument("--broker", default="tcp://127.0.0.1:5555",
                    help="the broker's frontend (fleet only)")
    ap.add_argument("--control", default=None,
                    help="the broker's control endpoint (fleet only; default: frontend port + 2)")
    ap.add_argument("--repeat", type=int, default=1, help="fits to run in this process")
    args = ap.parse_args(argv)

    X, y = make_classification(n_samples=20000, n_features=250, random_state=0)
    # random_state fixes SGD's shuffling, so every backend finds the same scores.
    search = GridSearchCV(SGDClassifier(max_iter=20, tol=None, random_state=0),
                          {"alpha": [1e-5, 1e-4, 1e-3, 1e-2]}, cv=5, n_jobs=-1)
    ctx, keep = backend_context(args)
    times = []
    with ctx:
        for i in range(args.repeat):
            t = time.perf_counter()
            search.fit(X, y)
            times.append(time.perf_counter() - t)
            print("fit %d: %.2f s, best %s score %.6f" % (i + 1, times[-1], search.best_params_,
                                                         search.best_score_), file=sys.stderr)
    if keep is not None:
        keep[0].close()
        keep[1].close()
    out = {"backend": args.backend, "best_params": search.best_params_,
           "best_score": search.best_score_, "times_s": times, "x_bytes": X.nbytes}
    if args.backend == "fleet":   # batches and bytes this process sent
        out["sent"] = dict(sys.modules["fleet.joblib"].stats)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

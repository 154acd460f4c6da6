"""XGBoost training on synthetic data (the harness's batch ML workload).

    python3 xgb_job.py ROWS COLS ROUNDS [SEED]

Prints one JSON line: phase times, a checksum of the predictions (compared with the all-local
run's by the harness) and the process's own peak RSS.
"""
import json
import resource
import sys
import time

t0 = time.monotonic()
import numpy as np  # noqa: E402
import xgboost as xgb  # noqa: E402

rows, cols, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 7
t_import = time.monotonic()
rng = np.random.default_rng(seed)
X = rng.standard_normal((rows, cols), dtype=np.float32)
w = rng.standard_normal(cols).astype(np.float32)
logit = X @ w + 0.5 * np.sin(3 * X[:, 0]) * X[:, 1] - 0.3 * (X[:, 2] > 0.5)
y = (logit + rng.standard_normal(rows).astype(np.float32) > 0).astype(np.float32)
del logit
t_gen = time.monotonic()
dtrain = xgb.DMatrix(X, label=y, nthread=2)
params = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": 8, "eta": 0.2,
          "max_bin": 256, "nthread": 2, "seed": seed, "eval_metric": "logloss"}
bst = xgb.train(params, dtrain, num_boost_round=rounds)
t_train = time.monotonic()
pred = bst.predict(xgb.DMatrix(X[:20000], nthread=2))
checksum = round(float(np.sum(pred.astype(np.float64))), 4)
acc = float(np.mean((pred > 0.5) == (y[:20000] > 0.5)))
print(json.dumps({
    "rows": rows, "cols": cols, "rounds": rounds,
    "import_s": round(t_import - t0, 3), "gen_s": round(t_gen - t_import, 3),
    "train_s": round(t_train - t_gen, 3), "total_s": round(time.monotonic() - t0, 3),
    "checksum": checksum, "train_accuracy_20k": round(acc, 4),
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}), flush=True)

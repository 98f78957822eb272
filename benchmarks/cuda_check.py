"""fedrisk on a GPU: every algorithm family, the ResNet-18 round and an NCCL run, each compared
with the CPU (or sequential) result, one PASS / FAIL line per check.

Checks (``--device`` defaults to ``cuda``; ``--device cpu`` compares the CPU with itself, a
smoke test of the script):

1. ``family/<name>``: one small config per family (CODASCA, CODA+, FESS-GDA on a fair game and
   on a 1-D WGAN, Local SGDA and SGDA+, FRPG under a Gaussian attack, robust SGD with Krum under
   ALIE, PERM through its weight estimation, two-stage PERM, IFCA, APPLE, FedFomo, FeDXL2,
   FeDXL2-NDCG, FedAvg, SCAFFOLD; see :data:`FAMILIES`), on the synthetic data that ships with
   fedrisk, built through the experiment layer with
   ``run.device``; ``--rounds`` rounds with the sequential and the vectorised executor on the
   device and on the CPU, in float32 and float64.  The final server and client states are
   compared: device vs CPU per executor, vectorised vs sequential on the device (relative
   difference ``max |a - b| / max(1, max |b|)`` per tensor; float32: ``--tol32``, float64:
   ``--tol64``).  Wall seconds per round (median after the first) for each.
2. ``runner``: ``fedrisk run``'s code path (``run_experiment``) with ``run.device`` on the
   device (evaluation, checkpoint, ``model.pt``; CODASCA, PERM with its personal models and
   weights, SCAFFOLD with client states on disk), its result against the same run on the CPU;
   ``model.pt`` must hold CPU tensors; the device checkpoint resumes into a CPU simulation and
   the CPU checkpoint into a device simulation.
3. ``resnet18``: ``benchmarks/resnet18_round.py`` on the device: sequential vs vectorised vs the
   hand-written ``functional_call`` loop (their parameters and running statistics compared after
   the first round: on this workload float32 rounding differences grow about tenfold a round,
   on the CPU too; the later rounds' differences are reported).
4. ``nccl``: ``torchrun --nproc-per-node 1`` (on 127.0.0.1) of ``_cuda_nccl_worker.py`` (the
   distributed executor, NCCL on CUDA, gloo with ``--device cpu``) for two configs, compared
   with the sequential executor on the device.

TF32 is switched off (``torch.backends.cuda.matmul.allow_tf32`` and cuDNN's), so float32 matmuls
are true float32.  Every check runs whatever happened before (a failure prints its traceback);
the exit status is 1 if any failed.  The JSON summary is rewritten after every check (a run cut
short keeps what it did); ``--budget-s S`` starts no check after S seconds (those not run count
as failed).  Needs no network and no dataset, only fedrisk's own
dependencies (torch, numpy, pydantic, tomli-w, tqdm); the third-party modules fedrisk imported
are listed at the end.  Expected to take two to three minutes on one GPU::

    PYTHONPATH=src python benchmarks/cuda_check.py --out cuda_check.json
    PYTHONPATH=src python benchmarks/cuda_check.py --device cpu --rounds 2 --resnet-rounds 1 --out /tmp/c.json
    python benchmarks/cuda_check.py --report cuda_check.json > benchmarks/RESULTS_cuda.md   # a Markdown table
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))
sys.path.insert(0, str(HERE))

#: two clusters of clients with their own test rows: the personalised families' data
PERSONAL_DATA = {
    "dataset": "perm_synthetic",
    "partition": "by_attribute",
    "num_clients": 4,
    "client_test_fraction": 0.2,
    "dataset_options": {"num_clients": 4, "samples_per_client": 60, "dim": 10, "test_per_client": 10},
}

FAMILIES: dict[str, dict[str, Any]] = {
    "fedavg": {
        "data": {"dataset": "mog_2d", "partition": "iid", "num_clients": 6,
                 "dataset_options": {"num_samples": 600, "test_samples": 120, "std": 0.3}},
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": {"name": "fedavg", "lr": 0.1, "local_steps": 3, "batch_size": 16},
    },
    "codasca": {
        "data": {"dataset": "multi_org_auc", "partition": "by_attribute", "num_clients": 5,
                 "dataset_options": {"test_size": 300, "dim": 16}},
        "model": {"name": "mlp", "hidden": [16], "output_activation": "sigmoid"},
        "algorithm": {"name": "codasca", "lr": 0.1, "window": 3, "stage_iters": 6, "lr_decay": 3.0,
                      "prox_coef": 0.001, "stage_output": "last_local_average_ref", "batch_size": 16},
        "run": {"metrics": ["auroc"]},
    },
    "codaplus": {
        "data": {"dataset": "multi_org_auc", "partition": "by_attribute", "num_clients": 5,
                 "dataset_options": {"test_size": 300, "dim": 16}},
        "model": {"name": "mlp", "hidden": [16], "output_activation": "sigmoid"},
        "algorithm": {"name": "codaplus", "lr": 0.1, "window": 3, "stage_iters": 6, "batch_size": 16},
        "run": {"metrics": ["auroc"]},
    },
    "fessgda_fair": {
        "data": {"dataset": "fair_groups_toy", "partition": "iid", "num_clients": 5,
                 "dataset_options": {"largest": 200, "test_per_group": 40}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "fessgda", "game": "fair_group", "group_attr": "group", "dual_dim": 5,
                      "smoothing": 0.1, "beta": 0.9, "lr": 0.1, "local_steps": 3, "batch_size": 20},
        "run": {"metrics": ["accuracy"]},
    },
    "fessgda_wgan": {
        "data": {"dataset": "wgan_1d", "partition": "iid", "num_clients": 5, "dataset_options": {"num_samples": 500}},
        "model": {"name": "affine_generator", "mu": 1.0, "sigma": 1.0},
        "algorithm": {"name": "fessgda", "game": "wgan", "wgan_lambda": 0.001, "smoothing": 1.0, "lr": 0.1,
                      "local_steps": 3, "batch_size": 50},
        "run": {"splits": [], "metrics": []},
    },
    "local_sgda": {
        "data": {"dataset": "nc_sc_quadratic", "partition": "by_attribute", "num_clients": 5,
                 "dataset_options": {"num_clients": 5, "samples_per_client": 40, "dim": 6}},
        "model": {"name": "vector", "num_outputs": 6, "init": 0.5},
        "algorithm": {"name": "fsgda", "game": "quadratic", "dual_dim": 6, "quadratic_mu": 1.0,
                      "quadratic_curvature": 1.0, "lr": 0.01, "local_steps": 3, "batch_size": 10},
        "run": {"splits": [], "metrics": []},
    },
    "frpg": {
        "data": {"dataset": "mog_2d", "partition": "iid", "num_clients": 6,
                 "dataset_options": {"num_samples": 600, "test_samples": 120, "std": 0.3}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "frpg", "lam": 1.6, "mu": 1e-3, "delta": 0.003, "delta_server": 0.003,
                      "lipschitz": 24.1, "batch_size": 10},
        "attack": {"name": "gaussian", "byzantine": [5]},
    },
    "perm": {  # 3 clients: epoch = estimate + 3 shuffle rounds; round 4 estimates the weights (eq. (2))
        "data": {"dataset": "perm_synthetic", "partition": "by_attribute", "num_clients": 3,
                 "client_test_fraction": 0.2,
                 "dataset_options": {"num_clients": 3, "samples_per_client": 60, "dim": 10, "test_per_client": 10}},
        "model": {"name": "logreg", "bias": False},
        "algorithm": {"name": "perm", "lr": 0.5, "local_steps": 3, "batch_size": 16, "lam": 10.0,
                      "global_lr": 0.5, "global_batch": 16},
        "run": {"rounds": 6},
    },
    "perm_two_stage": {
        "data": {"dataset": "perm_synthetic", "partition": "by_attribute", "num_clients": 3,
                 "client_test_fraction": 0.2,
                 "dataset_options": {"num_clients": 3, "samples_per_client": 60, "dim": 10, "test_per_client": 10}},
        "model": {"name": "logreg", "bias": False},
        "algorithm": {"name": "perm_two_stage", "lr": 0.5, "local_steps": 3, "batch_size": 16, "lam": 10.0,
                      "fedavg_rounds": 1},
    },
    "local_sgda_plus": {
        "data": {"dataset": "fair_groups_toy", "partition": "iid", "num_clients": 5,
                 "dataset_options": {"largest": 200, "test_per_group": 40}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "local_sgda_plus", "game": "fair_group", "group_attr": "group", "dual_dim": 5,
                      "lr": 0.1, "local_steps": 3, "batch_size": 20},
        "run": {"metrics": ["accuracy"]},
    },
    "robust_sgd_krum": {
        "data": {"dataset": "mog_2d", "partition": "iid", "num_clients": 6,
                 "dataset_options": {"num_samples": 600, "test_samples": 120, "std": 0.3}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "robust_sgd", "lr": 0.5, "batch_size": 10, "aggregator": {"name": "krum", "f": 1}},
        "attack": {"name": "alie", "byzantine": [5]},
    },
    "scaffold": {
        "data": {"dataset": "mog_2d", "partition": "iid", "num_clients": 6,
                 "dataset_options": {"num_samples": 600, "test_samples": 120, "std": 0.3}},
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": {"name": "scaffold", "lr": 0.1, "local_steps": 3, "batch_size": 16},
    },
    "ifca": {
        "data": PERSONAL_DATA,
        "model": {"name": "logreg"},
        "algorithm": {"name": "ifca", "lr": 0.5, "local_steps": 3, "batch_size": 16},
    },
    "apple": {
        "data": PERSONAL_DATA,
        "model": {"name": "logreg"},
        "algorithm": {"name": "apple", "lr": 0.5, "local_steps": 3, "batch_size": 16},
    },
    "fedfomo": {
        "data": {**PERSONAL_DATA, "client_validation_fraction": 0.2},
        "model": {"name": "logreg"},
        "algorithm": {"name": "fedfomo", "lr": 0.5, "local_steps": 3, "batch_size": 16},
    },
    "fedxl2": {
        "data": {"dataset": "multi_org_auc", "partition": "by_attribute", "num_clients": 5,
                 "dataset_options": {"test_size": 300, "dim": 16}},
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": {"name": "fedxl2", "lr": 0.5, "local_steps": 4, "batch_pos": 8, "batch_neg": 8,
                      "xrisk": "pauc", "surrogate": "squared_hinge", "lam": 1.0, "gamma": 0.1, "beta": 0.1},
        "run": {"metrics": ["auroc", "pauroc:0.3"]},
    },
    "fedxl2_ndcg": {
        "data": {"dataset": "synthetic_ranking", "partition": "by_attribute", "num_clients": 4,
                 "dataset_options": {"queries_per_client": 5, "items_per_query": 12, "test_queries_per_client": 4,
                                     "dim": 8, "shift": 0.5, "split": "items"}},
        "model": {"name": "logreg", "num_outputs": 1},
        "algorithm": {"name": "fedxl2_ndcg", "num_queries": 20, "lr": 0.5, "local_steps": 3, "batch_pos": 4,
                      "batch_neg": 4, "batch_partners": 4, "gamma": 0.9, "beta": 0.1, "eval_k": 5},
        "run": {"metrics": ["ndcg@5"]},
    },
}  # fmt: skip

NCCL_FAMILIES = ("fedavg", "perm")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# -- helpers ----------------------------------------------------------------------------------
def config(family: str, device: str, executor: str, dtype: str, rounds: int) -> Any:
    from fedrisk.experiment.config import resolve_config

    raw = {k: dict(v) for k, v in FAMILIES[family].items()}
    raw["run"] = {"seed": 3, "rounds": rounds, "eval_every": rounds, "threads": 0, **raw.get("run", {}),
                  "device": device, "executor": executor, "dtype": dtype}  # fmt: skip
    return resolve_config(raw)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def leaves(tree: Any, path: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of ``tree`` by a dotted path, on the CPU."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, torch.Tensor):
        out[path or "."] = tree.detach().cpu()
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out.update(leaves(v, f"{path}.{k}" if path else str(k)))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(leaves(v, f"{path}[{i}]"))
    return out


def final_state(sim: Any) -> dict[str, torch.Tensor]:
    states = sim.executor.collect_states(sim.client_states)
    return leaves({"server": sim.server_state, "clients": {k: states[k] for k in sorted(states)}})


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Largest absolute and relative (``/ max(1, max|b|)`` per tensor) difference of ``a`` from
    ``b``; integer / bool tensors must be equal (a difference counts as relative 1)."""
    if set(a) != set(b):
        return {"abs": math.inf, "rel": math.inf, "where": f"different tensors: {sorted(set(a) ^ set(b))[:4]}"}
    worst = {"abs": 0.0, "rel": 0.0, "where": ""}
    for k, x in a.items():
        y = b[k]
        if x.shape != y.shape:
            return {"abs": math.inf, "rel": math.inf, "where": f"{k}: shape {tuple(x.shape)} vs {tuple(y.shape)}"}
        if not x.is_floating_point():
            bad = 0.0 if torch.equal(x, y) else 1.0
            diff, rel = bad, bad
        elif x.numel() == 0:
            continue
        else:
            both_nan = torch.isnan(x) & torch.isnan(y)
            d = torch.where(both_nan, torch.zeros_like(x), (x.double() - y.double()).abs())
            diff = float(d.max())
            rel = diff / max(1.0, float(y.double().abs().nan_to_num().max()))
        if rel > worst["rel"] or math.isnan(rel):
            worst = {"abs": diff, "rel": rel, "where": k}
    return worst


def run_family(family: str, device: str, executor: str, dtype: str, rounds: int) -> dict[str, Any]:
    from fedrisk.experiment.runner import build_simulation

    cfg = config(family, device, executor, dtype, rounds)
    sim = build_simulation(cfg).simulation
    times = []
    for _ in range(cfg["run.rounds"]):
        sync(device)
        start = time.perf_counter()
        sim.step()
        sync(device)
        times.append(time.perf_counter() - start)
    devices = sorted({t.device.type for t in _tensors(sim.server_state)})
    return {"state": final_state(sim), "times": times, "server_devices": devices}


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


def per_round(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


# -- the checks -------------------------------------------------------------------------------
class Checks:
    """Runs checks one after another, whatever the earlier ones did; rewrites the JSON summary
    after each (a run stopped by a timeout leaves the checks done so far); checks that would
    start after ``budget_s`` seconds are recorded as not run (and count as failed)."""

    def __init__(self, out: Path, env: dict[str, Any], budget_s: float) -> None:
        self.results: list[dict[str, Any]] = []
        self.out, self.env, self.budget_s = out, env, budget_s
        self.started = time.perf_counter()

    def write(self) -> None:
        self.env["seconds"] = round(time.perf_counter() - self.started, 1)
        self.out.write_text(json.dumps({"environment": self.env, "checks": self.results}, indent=1, default=str))

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if time.perf_counter() - self.started > self.budget_s:
            self.results.append({"check": name, "ok": False, "seconds": 0.0, "summary": "not run: --budget-s spent"})
            print(f"SKIP {name} (not run: --budget-s {self.budget_s:g} spent; counts as failed)", flush=True)
            self.write()
            return
        start = time.perf_counter()
        try:
            info = fn()
            ok = bool(info.pop("ok"))
            error = None
        except Exception:
            info, ok, error = {}, False, traceback.format_exc()
        info.update({"check": name, "ok": ok, "seconds": round(time.perf_counter() - start, 2)})
        if error:
            info["error"] = error
        self.results.append(info)
        detail = info.get("summary", "")
        print(f"{'PASS' if ok else 'FAIL'} {name} ({info['seconds']:.1f} s) {detail}", flush=True)
        if error:
            print(error, flush=True)
        for where, tb in info.get("errors", {}).items():
            print(f"--- {name}: {where} raised:\n{tb}", flush=True)
        self.write()


def family_check(family: str, device: str, dtype: str, rounds: int, tol: float) -> dict[str, Any]:
    """Sequential and vectorised, on the CPU first (an algorithm the vectorised executor refuses
    there is skipped), then on ``device``; a run that raises is recorded and fails the check
    without stopping the other runs."""
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    errors: dict[str, str] = {}
    other = "cpu-again" if device == "cpu" else "cpu"
    for executor in ("sequential", "vectorized"):
        for dev in (other, device):
            try:
                runs[(dev, executor)] = run_family(
                    family, "cpu" if dev == "cpu-again" else dev, executor, dtype, rounds
                )
            except Exception as exc:
                if dev == other and executor == "vectorized" and "vectoriz" in str(exc):  # refused on the CPU too
                    skipped[executor] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    break
                errors[f"{dev}/{executor}"] = traceback.format_exc()
    diffs = {}
    for executor in ("sequential", "vectorized"):
        if (device, executor) in runs and (other, executor) in runs:
            a, b = runs[(device, executor)]["state"], runs[(other, executor)]["state"]
            diffs[f"{device}_vs_cpu/{executor}"] = compare(a, b)
    if (device, "vectorized") in runs and (device, "sequential") in runs:
        diffs[f"vectorized_vs_sequential/{device}"] = compare(
            runs[(device, "vectorized")]["state"], runs[(device, "sequential")]["state"]
        )
    where_wrong = [
        f"{e}: {r['server_devices']}"
        for (dev, e), r in runs.items()
        if dev == device and device != "cpu" and r["server_devices"] != [torch.device(device).type]
    ]
    ok = not errors and not where_wrong and bool(diffs) and all(d["rel"] <= tol for d in diffs.values())
    seconds = {f"{dev}/{e}": round(per_round(r["times"]), 5) for (dev, e), r in runs.items()}
    worst = max(diffs.values(), key=lambda d: d["rel"]) if diffs else {"rel": math.nan, "where": "no comparison"}
    summary = (
        "; ".join(f"{k} max|diff| {d['abs']:.1e} rel {d['rel']:.1e}" for k, d in diffs.items())
        + f"; worst rel {worst['rel']:.2e} (tol {tol:.0e}, at {worst['where']}); s/round "
        + ", ".join(f"{k} {v:.4f}" for k, v in seconds.items())
        + (f"; skipped {skipped}" if skipped else "")
        + (f"; server state not on the device: {where_wrong}" if where_wrong else "")
        + (f"; runs that raised: {sorted(errors)}" if errors else "")
    )
    out = {"ok": ok, "diffs": diffs, "seconds_per_round": seconds, "skipped": skipped, "summary": summary}
    if errors:
        out["errors"] = errors
    return out


RUNNER_FAMILIES = {  # a global model with AUC metrics; personal models and alpha.csv; client states on disk
    "codasca": {},
    "perm": {},
    "scaffold": {"run.client_states": "disk"},
}


def runner_check(device: str, rounds: int, tol: float) -> dict[str, Any]:
    """``run_experiment`` (what ``fedrisk run`` calls) on the device and on the CPU, per family of
    :data:`RUNNER_FAMILIES`: ``model.pt`` must hold CPU tensors and match; each run's checkpoint
    resumes into a simulation on the other device, whose next round matches the CPU's."""
    from fedrisk.experiment.runner import build_simulation, load_checkpoint, run_experiment

    out: dict[str, Any] = {"diffs": {}, "model_pt_devices": {}, "final": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for family, overrides in RUNNER_FAMILIES.items():
            dirs = {}
            for dev in dict.fromkeys((device, "cpu")):
                cfg = config(family, dev, "sequential", "float32", rounds)
                cfg = cfg.with_overrides({"run.eval_every": 1, "output.plots": False, **overrides})
                dirs[dev] = Path(tmp) / family / dev
                res = run_experiment(cfg, dirs[dev], progress="none")
                out["final"][f"{family}/{dev}"] = dict(res.summary.get("final", {}))
            model = torch.load(dirs[device] / "model.pt", weights_only=True)  # no map_location: CPU tensors?
            out["model_pt_devices"][family] = sorted({t.device.type for t in leaves(model).values()})
            ref = leaves(torch.load(dirs["cpu"] / "model.pt", weights_only=True))
            out["diffs"][f"{family}/model.pt"] = compare(leaves(model), ref)
            for src, dst in ((device, "cpu"), ("cpu", device)) if not overrides else ():  # disk states: the run dir's
                sim = build_simulation(config(family, dst, "sequential", "float32", rounds)).simulation
                sim.load_state_dict(load_checkpoint(dirs[src] / "checkpoint.pt")["simulation"])
                sim.step()
                base = build_simulation(config(family, "cpu", "sequential", "float32", rounds)).simulation
                base.load_state_dict(load_checkpoint(dirs["cpu"] / "checkpoint.pt")["simulation"])
                base.step()
                out["diffs"][f"{family}/resume {src} checkpoint on {dst}"] = compare(
                    final_state(sim), final_state(base)
                )
    wrong = {f: d for f, d in out["model_pt_devices"].items() if d != ["cpu"]}
    ok = not wrong and all(d["rel"] <= tol for d in out["diffs"].values())
    worst = max(out["diffs"].values(), key=lambda d: d["rel"])
    out.update(
        ok=ok,
        summary=f"model.pt devices {out['model_pt_devices']}; max rel diff {worst['rel']:.2e} (tol {tol:.0e}, at "
        f"{worst['where']}); final metrics agree: "
        + ", ".join(
            f"{f} " + str({k: round(v, 4) for k, v in list(out["final"][f"{f}/{device}"].items())[:2]})
            for f in RUNNER_FAMILIES
        ),
    )
    return out


def resnet_check(device: str, rounds: int, tol: float) -> dict[str, Any]:
    import resnet18_round

    res = resnet18_round.measure(device=device, rounds=rounds, threads=torch.get_num_threads())
    first = res["differences_by_round"][0]  # later rounds amplify float32 rounding (resnet18_round.measure)
    rel = {name: f"{d['params_rel']:.1e}" for name, d in first.items()}
    srel = {name: f"{d['stats_rel']:.1e}" for name, d in first.items()}
    growth = [max(d["params_rel"] for d in r.values()) for r in res["differences_by_round"]]
    ok = all(d[k] <= tol for d in first.values() for k in ("params_rel", "stats_rel"))
    med = res["median_wall"]
    res.update(
        ok=ok,
        summary=f"rel diff from the hand loop after round 1: params {rel}, running stats {srel} (tol {tol:.0e}); "
        f"params after each round {', '.join(f'{g:.1e}' for g in growth)}; s/round "
        + ", ".join(f"{k} {v:.4f}" for k, v in med.items()),
    )
    return res


def nccl_check(device: str, rounds: int, tol: float) -> dict[str, Any]:
    from fedrisk.runtime.distributed import free_port

    backend = "nccl" if device.startswith("cuda") else "gloo"
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
        env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(HERE / "_cuda_nccl_worker.py"), "--out", tmp, "--device", device, "--backend", backend,
            "--rounds", str(rounds), "--families", *NCCL_FAMILIES,
        ]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
        log = (proc.stdout + proc.stderr)[-4000:]
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{log}")
        diffs, times = {}, {}
        for family in NCCL_FAMILIES:
            got = torch.load(Path(tmp) / f"{family}.pt", weights_only=True)
            ref = run_family(family, device, "sequential", "float32", rounds)
            diffs[family] = compare(got["state"], ref["state"])
            times[family] = {
                "distributed": round(per_round(got["times"]), 5),
                "sequential": round(per_round(ref["times"]), 5),
            }
    ok = all(d["rel"] <= tol for d in diffs.values())
    worst = max(diffs.values(), key=lambda d: d["rel"])
    return {
        "ok": ok,
        "backend": backend,
        "diffs": diffs,
        "seconds_per_round": times,
        "log_tail": log[-1500:],
        "summary": f"backend {backend}; max rel diff from the sequential executor {worst['rel']:.2e} (tol {tol:.0e}, "
        f"at {worst['where']}); s/round {times}",
    }


def third_party_modules() -> list[str]:
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    tops = {m.split(".")[0] for m in list(sys.modules)}
    here = {p.stem for p in HERE.glob("*.py")}  # this folder's own scripts
    return sorted(t for t in tops if t not in stdlib | here and not t.startswith("_") and t not in ("fedrisk", "torch"))


def markdown(summary: dict[str, Any]) -> str:
    """A Markdown report of a JSON summary (``--report FILE``): the environment and one table
    row per check (result, the worst relative difference, seconds per round)."""
    env = summary["environment"]
    lines = [
        f"Measured {env['date']} on {env.get('gpu') or env['device']} (torch {env['torch']}, CUDA {env['cuda']}, "
        f"Python {env['python']}, TF32 {env['tf32']}), {env.get('seconds', '?')} s in all, with",
        "",
        "```bash",
        "PYTHONPATH=src python benchmarks/cuda_check.py --out cuda_check.json",
        "```",
        "",
        "| check | result | worst relative difference (where) | seconds per round |",
        "|---|---|---|---|",
    ]
    for c in summary["checks"]:
        diffs = c.get("diffs") or {}
        worst = max(diffs.values(), key=lambda d: d["rel"]) if diffs else None
        diff = f"{worst['rel']:.1e} ({worst['where'] or '-'})" if worst else "-"
        times = c.get("seconds_per_round") or c.get("median_wall") or {}
        shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in times.items())
        result = "PASS" if c["ok"] else ("not run" if c.get("summary", "").startswith("not run") else "FAIL")
        if c["check"] == "resnet18":
            d = (c.get("differences_by_round") or [c.get("differences", {})])[0]
            diff = ", ".join(f"{n} {v['params_rel']:.1e} / stats {v['stats_rel']:.1e}" for n, v in d.items()) or "-"
        lines.append(f"| {c['check']} | {result} | {diff} | {shown or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", default="cuda", help='"cuda", "cuda:N" or "cpu" (a smoke test: the CPU against itself)')
    p.add_argument("--out", default="cuda_check.json", help="the JSON summary")
    p.add_argument("--rounds", type=int, default=4, help="rounds per family run")
    p.add_argument("--resnet-rounds", type=int, default=3, help="timed ResNet-18 rounds (after one warm-up)")
    p.add_argument("--tol32", type=float, default=1e-4, help="relative tolerance in float32")
    p.add_argument("--tol64", type=float, default=1e-9, help="relative tolerance in float64")
    p.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--skip", nargs="*", default=[], choices=["families", "runner", "resnet18", "nccl"])
    p.add_argument("--budget-s", type=float, default=math.inf, help="start no check after this many seconds")
    p.add_argument("--report", metavar="JSON", help="print a Markdown report of a summary written by --out, and stop")
    args = p.parse_args()
    if args.report:
        print(markdown(json.loads(Path(args.report).read_text())), end="")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    from fedrisk.runtime.device import resolve_device

    device = str(resolve_device(args.device, "--device"))
    env = {
        "device": device,
        "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"cuda_check: {env}", flush=True)
    checks = Checks(Path(args.out), env, args.budget_s)
    tol = {"float32": args.tol32, "float64": args.tol64}

    def families(dtype: str) -> None:
        if "families" not in args.skip:
            for family in args.families:
                checks.run(
                    f"family/{family}/{dtype}",
                    lambda f=family: family_check(f, device, dtype, args.rounds, tol[dtype]),
                )

    # the order puts one check of each kind early, in case --budget-s or a timeout cuts the run short
    families("float32")
    if "resnet18" not in args.skip:
        checks.run("resnet18", lambda: resnet_check(device, args.resnet_rounds, args.tol32))
    if "nccl" not in args.skip:
        checks.run("nccl", lambda: nccl_check(device, args.rounds, args.tol32))
    if "runner" not in args.skip:
        checks.run("runner", lambda: runner_check(device, args.rounds, args.tol32))
    families("float64")
    failed = [r["check"] for r in checks.results if not r["ok"]]
    env["third_party_modules"] = third_party_modules()
    checks.write()
    print(f"third-party modules imported: {', '.join(env['third_party_modules'])}")
    print(
        f"{'ALL PASSED' if not failed else 'FAILED: ' + ', '.join(failed)} "
        f"({len(checks.results) - len(failed)}/{len(checks.results)} checks, {env['seconds']} s); summary: {args.out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

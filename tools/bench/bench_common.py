"""Helpers shared by the peer benchmarks in tools/bench/ (no torch import here).

Each engine runs in a process of its own, under the OpenMP wait settings of the round: an OpenMP
runtime reads them when it loads, and a torch pool spinning in the script's own process under
OMP_WAIT_POLICY=active took a third of moh's speed when moh ran beside it (docs/benchmarks.md, Wait
policy). Policies: "own" = each engine at its own default (OMP_WAIT_POLICY and GOMP_SPINCOUNT unset:
libgomp's default for torch, moh's own choice for moh), "passive", "active". The headline compares
each engine at its best policy."""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def med(xs):
    return statistics.median(xs)


def cell(xs, prec=2):
    """median (min-max)"""
    return f"{med(xs):.{prec}f} ({min(xs):.{prec}f}-{max(xs):.{prec}f})"


POLICIES = ("own", "passive", "active")


def engine_env(policy, threads):
    """The environment of an engine's process: OMP_NUM_THREADS=threads and the wait policy."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_NUM_THREADS"] = str(threads)
    if policy != "own":
        env["OMP_WAIT_POLICY"] = policy
    return env


def run_json(cmd, policy, threads):
    """Runs cmd (printing JSON on stdout) in its own process under policy; returns the JSON."""
    out = subprocess.run(cmd, capture_output=True, text=True, env=engine_env(policy, threads))
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def run_moh(cmd, threads, policy="own"):
    """Runs a `moh bench ... --json` command; returns its JSON rows."""
    return run_json(cmd, policy, threads)


def run_worker(a, policy):
    """Runs this script again as its peer worker (--worker) under policy; returns its JSON."""
    return run_json([sys.executable, sys.argv[0]] + sys.argv[1:] + ["--worker"], policy, a.threads)


def policies(a):
    ps = [p for p in a.wait_policy.split(",") if p]
    bad = [p for p in ps if p not in POLICIES]
    if bad or not ps:
        sys.exit(f"--wait-policy {a.wait_policy}: expected a list of {', '.join(POLICIES)}")
    return ps


def best_policy(per_policy, higher=True):
    """(policy, values) of the best median among {policy: [values]} (higher or lower is better)."""
    items = [(p, v) for p, v in per_policy.items() if v]
    return (max if higher else min)(items, key=lambda pv: med(pv[1]))


def conditions(a):
    return (f"{cpu_model()}; {a.threads} threads (moh OMP_NUM_THREADS, torch.set_num_threads); "
            f"wait policies {a.wait_policy} (each engine in its own process; own = its default); "
            f"load average {load_average()}; {a.rounds} rounds, engines alternated")


def add_torch_peer_args(ap, bench):
    """The options every moh-vs-torch script takes (bench: the `moh bench` subcommand)."""
    ap.add_argument("--moh", default="build/moh")
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, engines alternated (default 3)")
    ap.add_argument("--precisions", default="fp32,bf16", help="torch precisions: fp32,bf16 (autocast)")
    ap.add_argument("--moh-args", default="", help=f"extra options for moh bench {bench}")
    ap.add_argument("--wait-policy", default="own,passive,active",
                    help="OpenMP wait policies to run each engine under, each in its own processes: own (the "
                         "engine's default), passive, active (default all three; the headline takes each engine's best)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def start_torch(a):
    """In the torch worker: imports torch with a.threads threads; returns (torch, torch_peers)."""
    import torch
    import torch_peers
    torch.set_num_threads(a.threads)
    return torch, torch_peers

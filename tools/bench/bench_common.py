"""Helpers shared by the peer benchmarks in tools/bench/ (no torch import here: the scripts set
OMP_WAIT_POLICY before any OpenMP runtime loads)."""
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


def run_moh(cmd, threads):
    """Runs a `moh bench ... --json` command with OMP_NUM_THREADS=threads; returns its JSON rows."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def add_torch_peer_args(ap, bench):
    """The options every moh-vs-torch script takes (bench: the `moh bench` subcommand)."""
    ap.add_argument("--moh", default="build/moh")
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, engines alternated (default 3)")
    ap.add_argument("--precisions", default="fp32,bf16", help="torch precisions: fp32,bf16 (autocast)")
    ap.add_argument("--moh-args", default="", help=f"extra options for moh bench {bench}")
    ap.add_argument("--wait-policy", choices=["passive", "active"], default="passive",
                    help="OMP_WAIT_POLICY for both engines (default passive)")
    ap.add_argument("--json", help="also write the results to this file")


def start_torch(a):
    """Sets OMP_WAIT_POLICY, then imports torch (its libgomp reads it at load) with a.threads
    threads; returns (torch, torch_peers)."""
    os.environ["OMP_WAIT_POLICY"] = a.wait_policy
    import torch
    import torch_peers
    torch.set_num_threads(a.threads)
    return torch, torch_peers

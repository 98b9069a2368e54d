"""Hardware efficiency on an emulated cluster: the link, and seconds per update at every
number of groups.

On the emulated cluster of `--spec` (default `cpu-cluster-1gbit`: 8 hosts of a quarter
core each, the parameter server behind 1 Gbit/s per direction), in one run:

* `link_mb_s`: the parameter server's link, measured through its shaped port in both
  directions (`omnikeras.emulation.link_probe`, 50 MB each way), in MB/s (10^6 bytes):
  the spec's bandwidth, within 10%, or the emulation is wrong.
* `spu_by_groups`: seconds per update of the reference CNN (1.2M parameters, batch 64
  per update, SGD with momentum 0.9) launched with `omnikeras launch --emulate SPEC
  --groups g` for every g that divides the hosts: the chief measures, after a warm-up,
  the updates the server applies in a fixed window. Progress also shows the share of the
  chief's time spent exchanging with the server (gradients out, the group step, weights
  back) against computing: with one group on a 1 Gbit/s link, the exchange dominates.
* `async_over_sync_updates_per_s`: updates per second of the most asynchronous layout
  (one group per host) over the synchronous one (one group).

The hardware-efficiency curve goes to `--plot` (default `docs/emulated_cluster_he.png`).
The last line of stdout is one JSON object:
`{"link_mb_s": .., "spu_by_groups": {"1": .., ...}, "async_over_sync_updates_per_s": ..}`.
Needs root (network namespaces, traffic shaping, cgroups). `--quick` emulates 2 hosts of
half a core, a few seconds per layout, for a correctness check.

    .venv/bin/python benchmarks/emulated_cluster.py [--spec NAME|FILE] [--quick]
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

from omnikeras.emulation import ClusterSpec, EmulatedCluster

WORKER_SCRIPT = pathlib.Path(__file__).with_name("emulated_cluster_worker.py")
# What --quick emulates: two hosts of half a core.
QUICK_FIELDS = {"link": "1gbit", "hosts": [{"name": "half", "cpus": 0.5, "count": 2}]}
_PROBE_PORT = 7100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_link(spec: ClusterSpec, megabytes: float) -> dict[str, float]:
    with EmulatedCluster(spec) as cluster:
        cluster.shape([_PROBE_PORT])
        probe = [sys.executable, "-m", "omnikeras.emulation.link_probe", "--port", str(_PROBE_PORT), "--megabytes", str(megabytes)]
        result = subprocess.run(cluster.command(probe), capture_output=True, text=True, timeout=300, check=True)
    return json.loads(result.stdout)


def seconds_per_update(spec: ClusterSpec, spec_arg: str, groups: int, warmup: float, seconds: float, log_dir: str) -> dict:
    command = [
        sys.executable, "-m", "omnikeras", "launch", "--emulate", spec_arg, "--groups", str(groups),
        "--log-dir", f"{log_dir}/groups-{groups}", str(WORKER_SCRIPT), "--warmup", str(warmup), "--seconds", str(seconds),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"the run with {groups} groups failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def plot(spu: dict[int, float], shares: dict[int, float], spec: ClusterSpec, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    groups = sorted(spu)
    axis.plot(groups, [spu[g] for g in groups], marker="o", label="measured")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xticks(groups, [str(g) for g in groups])
    axis.set_xlabel("groups (1 = synchronous, hosts = fully asynchronous)")
    axis.set_ylabel("seconds per update")
    for g in groups:
        axis.annotate(f"exchange {shares[g]:.0%}", (g, spu[g]), textcoords="offset points", xytext=(4, 6), fontsize=8)
    axis.set_title(f"Hardware efficiency, {spec.name}: reference CNN, batch 64")
    axis.grid(True, which="both", alpha=0.3)
    axis.margins(y=0.2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default="cpu-cluster-1gbit", help="a built-in spec or a spec file")
    parser.add_argument("--quick", action="store_true", help="2 hosts, a few seconds per layout")
    parser.add_argument("--plot", type=pathlib.Path, default=pathlib.Path("docs/emulated_cluster_he.png"))
    args = parser.parse_args()
    warmup, seconds, megabytes = (2.0, 4.0, 10.0) if args.quick else (10.0, 30.0, 50.0)
    with tempfile.TemporaryDirectory() as work:
        spec_arg = args.spec
        if args.quick:
            spec_arg = str(pathlib.Path(work) / "two-halves-1gbit.json")
            pathlib.Path(spec_arg).write_text(json.dumps(QUICK_FIELDS))
        spec = ClusterSpec.load(spec_arg)
        link = measure_link(spec, megabytes)
        link_mb_s = (link["to_server_mb_s"] + link["from_server_mb_s"]) / 2
        expected = spec.link_bits_per_second / 8e6
        log(f"link: to the server {link['to_server_mb_s']:.1f} MB/s, from it {link['from_server_mb_s']:.1f} MB/s; "
            f"the spec says {expected:.1f} MB/s ({link_mb_s / expected - 1:+.1%})")
        hosts = len(spec.hosts)
        spu: dict[int, float] = {}
        shares: dict[int, float] = {}
        for groups in [g for g in range(1, hosts + 1) if hosts % g == 0]:
            result = seconds_per_update(spec, spec_arg, groups, warmup, seconds, work)
            spu[groups], shares[groups] = result["seconds_per_update"], result["exchange_share"]
            log(
                f"{groups} group{'s' * (groups > 1)} of {hosts // groups}: {result['seconds_per_update'] * 1e3:.0f} ms per update "
                f"({result['updates']} updates in {seconds:.0f} s); the chief spent {result['exchange_share']:.0%} of its time "
                f"exchanging with the server and {1 - result['exchange_share']:.0%} computing"
            )
    if not args.quick:
        plot(spu, shares, spec, args.plot)
        log(f"hardware-efficiency curve: {args.plot}")
    print(json.dumps({
        "link_mb_s": round(link_mb_s, 1),
        "spu_by_groups": {str(g): round(s, 4) for g, s in spu.items()},
        "async_over_sync_updates_per_s": round(spu[1] / spu[hosts], 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

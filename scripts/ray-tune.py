#!/usr/bin/env python3
"""Runs the shards of a gemtune sweep as Ray tasks, then merges them.

    scripts/ray-tune.py --shards 8 --out reports/sweep -- tune attn_decode --budget-ms 100
    scripts/ray-tune.py --shards 2 --local-ray --cpu --out /tmp/r -- check gemv --compile-only
    scripts/ray-tune.py --shards 2 --local --out /tmp/r -- check gemv --compile-only

Each shard I of N is one task that runs `gemtune ARGS --shard I/N --out DIR`
(ARGS: the gemtune command line after `--`, `check` or `tune`), holding one
GPU (`num_gpus=1`: Ray sets CUDA_VISIBLE_DEVICES, so the shard's gemtune
sees and uses that GPU only) or, with `--cpu`, one CPU. A task sends its
report directory back to the driver as a tar archive (the nodes need no
shared file system), which unpacks it into OUT/shard-I-of-N and then runs
`gemtune merge` of every shard into OUT.

Where to run:
  (default)    an existing Ray cluster: ray.init(address="auto")
  --local-ray  a Ray instance started here by the script (CPU-only tests)
  --local      no Ray: a local process pool runs the same shard commands

The gemtune binary is --gemtune, else $GEMTUNE, else `gemtune` on PATH; on
a cluster it must exist at that path on every node, and the checkout
(its variants/ directory) at the directory the script runs from (or set
GEMTUNE_VARIANTS). Exit status: 4 when a shard wrote no report or the merge
failed; otherwise the worst shard status (0 pass, 3 correctness failure).
"""

import argparse
import concurrent.futures
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

EXIT_INFRA = 4


def gemtune_binary(arg):
    return arg or os.environ.get("GEMTUNE") or shutil.which("gemtune") or "gemtune"


def run_shard(binary, args, index, count, cwd, env_extra):
    """Runs one shard into a scratch directory; returns (index, exit code,
    the tail of its output, the report directory as tar bytes or None)."""
    with tempfile.TemporaryDirectory(prefix=f"gemtune-shard-{index}-") as tmp:
        out = os.path.join(tmp, "report")
        cmd = [binary, *args, "--shard", f"{index}/{count}", "--out", out]
        env = dict(os.environ, **env_extra)
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        tail = (p.stdout[-2000:] + "\n" + p.stderr[-4000:]).strip()
        if not os.path.isfile(os.path.join(out, "run.json")):
            return index, p.returncode, tail, None
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(out, arcname=".")
        return index, p.returncode, tail, buf.getvalue()


def unpack(data, dest):
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar.getmembers():
            # Shard archives hold plain files and directories of one report.
            if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in m.name:
                raise ValueError(f"unexpected member {m.name!r} in a shard archive")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)


def run_with_ray(opts, binary, args, cwd, env_extra):
    import ray  # imported here: --local needs no Ray

    if opts.local_ray:
        ray.init(num_cpus=opts.num_cpus, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=opts.address)
    try:
        task = ray.remote(run_shard)
        if opts.cpu:
            task = task.options(num_cpus=1, num_gpus=0)
        else:
            task = task.options(num_cpus=1, num_gpus=1)
        refs = [
            task.remote(binary, args, i, opts.shards, cwd, env_extra)
            for i in range(1, opts.shards + 1)
        ]
        return ray.get(refs)
    finally:
        ray.shutdown()


def run_locally(opts, binary, args, cwd, env_extra):
    workers = opts.num_cpus or os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futs = [
            pool.submit(run_shard, binary, args, i, opts.shards, cwd, env_extra)
            for i in range(1, opts.shards + 1)
        ]
        return [f.result() for f in futs]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shards", type=int, required=True, help="number of shards (tasks)")
    ap.add_argument("--out", required=True, help="directory of the merged report")
    ap.add_argument("--gemtune", help="gemtune binary (default: $GEMTUNE, else PATH)")
    ap.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--local-ray", action="store_true", help="start a local Ray instance")
    where.add_argument("--local", action="store_true", help="no Ray: a local process pool")
    ap.add_argument("--cpu", action="store_true", help="tasks hold a CPU, not a GPU")
    ap.add_argument("--num-cpus", type=int, help="CPUs of the local Ray instance or pool")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- gemtune check|tune ...")
    opts = ap.parse_args(argv)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    if not args or args[0] not in ("check", "tune"):
        ap.error("give the gemtune command after --: check ... or tune ...")
    if opts.shards < 1:
        ap.error("--shards must be >= 1")
    for bad in ("--shard", "--out", "--resume"):
        if any(a == bad or a.startswith(bad + "=") for a in args):
            ap.error(f"{bad} is set by the script")
    binary = gemtune_binary(opts.gemtune)
    cwd = os.getcwd()
    # The cubin cache of each node; the variants of this checkout.
    env_extra = {
        k: os.environ[k]
        for k in ("GEMTUNE_CACHE_DIR", "GEMTUNE_VARIANTS", "LD_LIBRARY_PATH")
        if k in os.environ
    }
    run = run_locally if opts.local else run_with_ray
    results = sorted(run(opts, binary, args, cwd, env_extra), key=lambda r: r[0])

    shard_root = os.path.join(opts.out, "shards")
    dirs, worst, failed = [], 0, False
    for index, code, tail, data in results:
        print(f"shard {index}/{opts.shards}: exit {code}", file=sys.stderr)
        if data is None:
            print(f"shard {index} wrote no report:\n{tail}", file=sys.stderr)
            failed = True
            continue
        d = os.path.join(shard_root, f"shard-{index}-of-{opts.shards}")
        shutil.rmtree(d, ignore_errors=True)
        unpack(data, d)
        dirs.append(d)
        worst = max(worst, code)
    if failed or not dirs:
        return EXIT_INFRA
    m = subprocess.run([binary, "merge", *dirs, "--out", opts.out], cwd=cwd)
    if m.returncode != 0:
        return EXIT_INFRA
    return worst


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A fake `gemtune bench --worker` for the CPU tests of `gemtune ab`.

Speaks the worker protocol (harness/src/ab/protocol.rs) with canned,
controllable numbers. Knobs are environment variables; FAKE_<KNOB> applies
to every arm and FAKE_<KNOB>_<NAME> to the arm whose name is NAME (the
--profile file stem, or --fake-name, upper-cased, '-' -> '_'):

  SPEEDUP        t/s multiplier of every phase (1.05 = 5 % faster)
  PHASE_SPEEDUP  "attn_swa=1.5": only that phase's time is divided by 1.5
  NOISE          sd of a log-normal factor per rep (0.01 = 1 %)
  THROTTLE       reason reported on every rep ("hw_slowdown"), with its
                 clock drop and a 12 % slow-down; "REASON@3,7" only on the
                 arm's 3rd and 7th bench request (1-based, warm-ups counted)
  SEED           seed of the noise (default 1)
  LOGIT_DELTA    added to one logit per row (large values flip the top-1)
  DIE_AT         exit 3 (after a line on stderr) on this request number
  BAD_AT         answer this request number with a line that is not JSON
  READY          "bad": the first line is not a ready line
  HANG_ON        "logits" or "bench": the first request of that op writes
                 its output file (logits) or nothing (bench), touches
                 FAKE_HANG_MARK and sleeps for an hour (the signal tests)
Global: FAKE_COUNTER (a file both arms count their bench requests in: the
run-wide request number drives the drift and seeds each request's noise, so
a run is reproducible and two arms of one name still draw different noise),
FAKE_DRIFT (fractional slow-down per bench request of the run), FAKE_VOCAB
(default 256), FAKE_LOG (a file every request is appended to: "name op"),
FAKE_PIDS (a file each worker appends its process id to as it starts),
FAKE_HANG_MARK (the file HANG_ON touches).
"""
import json
import math
import os
import random
import struct
import sys
import time
import zlib

args = sys.argv[1:]


def opt(name, default=None):
    if name in args:
        i = args.index(name)
        if i + 1 < len(args):
            return args[i + 1]
    return default


if args[:2] != ["bench", "--worker"]:
    sys.stderr.write("fake worker: expected 'bench --worker', got %r\n" % args)
    sys.exit(2)

name = opt("--fake-name") or os.path.splitext(os.path.basename(opt("--profile", "default")))[0]
NAME = name.upper().replace("-", "_")


def knob(k, d=None):
    return os.environ.get("FAKE_%s_%s" % (k, NAME), os.environ.get("FAKE_" + k, d))


speed = float(knob("SPEEDUP", "1.0"))
noise = float(knob("NOISE", "0"))
logit_delta = float(knob("LOGIT_DELTA", "0"))
drift = float(os.environ.get("FAKE_DRIFT", "0"))
vocab = int(os.environ.get("FAKE_VOCAB", "256"))
die_at = int(knob("DIE_AT", "0"))
bad_at = int(knob("BAD_AT", "0"))
throttle = knob("THROTTLE", "")
throttle_at = None
if "@" in throttle:
    throttle, at = throttle.split("@", 1)
    throttle_at = {int(x) for x in at.split(",") if x}
phase_speedup = {}
for kv in (knob("PHASE_SPEEDUP", "") or "").split(","):
    if "=" in kv:
        k, v = kv.split("=", 1)
        phase_speedup[k.strip()] = float(v)
log = os.environ.get("FAKE_LOG")
seed = int(knob("SEED", "1"))
hang_on = knob("HANG_ON", "")
if os.environ.get("FAKE_PIDS"):
    with open(os.environ["FAKE_PIDS"], "a") as f:
        f.write("%d\n" % os.getpid())


def hang():
    mark = os.environ.get("FAKE_HANG_MARK")
    if mark:
        with open(mark, "a") as f:
            f.write("%s\n" % name)
    time.sleep(3600)

# Per-token prefill phase times (ms) and decode step phase times (ms).
PREFILL = {"embed": 0.002, "attn_swa": 0.030, "attn_full": 0.010, "gemm_qkv": 0.012,
           "gemm_o": 0.006, "gemm_ffn_up": 0.025, "gemm_ffn_down": 0.020,
           "norm_rope": 0.004, "head": 0.003, "other": 0.002}
DECODE = {"embed": 0.01, "attn_swa": 0.40, "attn_full": 0.30, "gemm_qkv": 0.60,
          "gemm_o": 0.30, "gemm_ffn_up": 1.20, "gemm_ffn_down": 1.00,
          "norm_rope": 0.10, "head": 0.50, "other": 0.09}


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def next_global():
    path = os.environ.get("FAKE_COUNTER")
    if not path:
        return 0
    try:
        with open(path) as f:
            n = int(f.read().strip() or "0")
    except OSError:
        n = 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    return n


sys.stderr.write("fake worker %s: loading\n" % name)
if knob("READY") == "bad":
    out({"hello": "world"})
else:
    out({
        "ready": True, "version": "0.1.0", "git": "fake-" + name,
        "model": {"path": "/fake/e4b-q8_0.gguf", "name": "e4b", "wtype": "Q8_0",
                  "bytes": 8000000000, "params": 7520000000},
        "backend": "cuda", "profile": name,
        "gpu": {"name": "Fake GPU", "driver": "0.0", "sm_count": 132},
        "slots": {"attn_prefill_swa": "attn_prefill/" + ("flash-swa" if "flash" in name else "mma-bq64"),
                  "prefill_gemm": "gemm_wgmma/best", "decode_gemv": "gemv/planes"},
    })

n_req = 0
n_bench = 0
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    n_req += 1
    req = json.loads(line)
    op = req.get("op")
    if log:
        with open(log, "a") as f:
            f.write("%s %s\n" % (name, op))
    if die_at and n_req == die_at:
        sys.stderr.write("fake worker %s: simulated crash on request %d\n" % (name, n_req))
        sys.exit(3)
    if bad_at and n_req == bad_at:
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
        continue
    if op == "quit":
        sys.exit(0)
    if op == "logits":
        toks = req["tokens"]
        with open(req["path"], "wb") as f:
            for i in range(len(toks)):
                r = random.Random(zlib.crc32(struct.pack("<%dI" % (i + 1), *toks[: i + 1])))
                row = [r.gauss(0.0, 3.0) for _ in range(vocab)]
                if logit_delta:
                    row[(i * 7 + 3) % vocab] += logit_delta
                f.write(struct.pack("<%df" % vocab, *row))
        if hang_on == "logits":
            hang()
        out({"ok": True, "rows": len(toks), "vocab": vocab})
        continue
    if op == "bench":
        if hang_on == "bench":
            hang()
        n_bench += 1
        g = next_global()
        rng = random.Random(zlib.crc32(("%s/%d/%d" % (name, seed, g)).encode()))
        factor = speed * math.exp(rng.gauss(0.0, noise)) * (1.0 - drift) ** g
        thr = ""
        sm_mean = 1980.0
        if throttle and (throttle_at is None or n_bench in throttle_at):
            thr = throttle
            sm_mean = 1500.0
            factor *= 0.88
        n_p, n_g = req["n_prompt"], req["n_gen"]
        pre = {k: v * n_p / phase_speedup.get(k, 1.0) / factor for k, v in PREFILL.items()}
        dec = {k: v / phase_speedup.get(k, 1.0) / factor for k, v in DECODE.items()}
        pp_ms = sum(pre.values())
        step = sum(dec.values())
        out({"ok": True, "pp_tps": 1000.0 * n_p / pp_ms, "tg_tps": 1000.0 / step if n_g else 0.0,
             "pp_ms": pp_ms, "tg_ms": step * n_g,
             "phases": {"prefill": pre, "decode": dec},
             "clocks": {"sm_mhz_min": sm_mean - 15, "sm_mhz_mean": sm_mean, "mem_mhz": 2619,
                        "temp_c_max": 61, "power_w_mean": 540, "throttle": thr}})
        continue
    out({"ok": False, "error": "unknown op %r" % op})

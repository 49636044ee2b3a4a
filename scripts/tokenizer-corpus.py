#!/usr/bin/env python3
"""Writes a deterministic multilingual tokenizer test corpus.

Usage:
    python3 scripts/tokenizer-corpus.py OUT.txt [--seed 20261126] [--bytes 1200000]

The same seed and size give the same bytes on every machine (only the
standard library's `random.Random` with integer seeds is used, whose
`random`, `randrange` and `choice` streams are stable across Python 3
versions), so the corpus is regenerated rather than committed.

Each line is one record drawn from a mix of generators: prose in many
scripts (Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Bengali, Thai,
Chinese, Japanese, Korean, Georgian, Armenian, Amharic, Vietnamese), source
code in several languages with space and tab indentation, emoji (ZWJ
sequences, skin tones, flags, keycaps, variation selectors), whitespace runs
(spaces, tabs, no-break and ideographic spaces, zero-width characters,
CR LF), numbers (long digit runs, decimals, dates, hex, non-ASCII digits),
strings that are or resemble special tokens (`<bos>`, `<start_of_turn>`,
`<unused17>`, `<table>`, Gemma 4's `<|turn>` / `<|channel>`, byte-token
look-alikes such as `<0x41>`, broken variants), rare code points that need
the byte fallback, control characters, and very long lines without a
newline. Groups of 2 to 40 empty lines put runs of newlines into the text.
"""

import argparse
import random
import sys
from pathlib import Path

WORDS = {
    "en": "the of and to in is that for it as with was on be by at this from have not are but "
          "which they or one had all their there were when we can an your more been would who "
          "tokenizer merge vocabulary weather library bridge quietly remarkable".split(),
    "de": "der die und das ist nicht mit auf für Straße Grüße München Äpfel Übermut schön "
          "Fußgängerüberweg Brötchen Mädchen heißt groß Käse fünfzehn".split(),
    "fr": "le la les et est dans une pour pas que qui avec où été très là-bas français "
          "bibliothèque église garçon déjà naïf cœur Noël".split(),
    "es": "el la los que de y en un una es por con para señora mañana niño año corazón "
          "estación ¿Dónde ¡Hola pingüino".split(),
    "pl": "się że nie jest jak ale tak może źdźbło zażółć gęślą jaźń łódź Kraków".split(),
    "tr": "bir ve bu için çok daha ğüşıöç İstanbul ışık değil güzel".split(),
    "vi": "tôi bạn của và không một những được người Việt Nam tiếng xin chào cảm ơn".split(),
    "ru": "и в не на я что он с как это по но они к у же вы за бы Москва съешь ещё "
          "мягких французских булок щётка".split(),
    "uk": "і та що як це для ґанок їжак єнот Київ".split(),
    "el": "και το να της η είναι στο με για ο ψυχή Αθήνα ευχαριστώ".split(),
    "ar": "في من على إلى أن هذا التي مع كان عن العربية مرحبا شكرا كتاب".split(),
    "he": "של את על זה לא עם הוא אני שלום תודה ספר".split(),
    "hi": "है के में की और को से यह एक नमस्ते धन्यवाद भारत हिन्दी".split(),
    "bn": "এবং এই একটি করে থেকে বাংলা ধন্যবাদ".split(),
    "ka": "და არის ეს რომ საქართველო გამარჯობა".split(),
    "hy": "և է այդ որ Հայաստան բարեւ".split(),
    "am": "እና ነው ይህ ሰላም አማርኛ".split(),
    "ko": "나는 그리고 하지만 한국어 문장 바이트로 돌아옵니다 안녕하세요 감사합니다".split(),
}
# Scripts written without spaces between words.
GLUED = {
    "zh": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年今天气很好公园散步北京"),
    "ja": ["今日", "は", "雨", "が", "降って", "います", "東京", "から", "大阪", "まで",
           "新幹線", "で", "行きます", "ありがとう", "カタカナ", "ひらがな", "漢字"],
    "th": ["ภาษา", "ไทย", "สวัสดี", "ครับ", "ขอบคุณ", "มาก", "ประเทศ", "กรุงเทพ"],
}
END = {"zh": "。！？", "ja": "。！？", "th": " ", "ar": ".؟!", "hi": "।?", "bn": "।",
       "el": ".;", "am": "።"}

EMOJI = ["😀", "🎉", "🚀", "🦀", "❤️", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪", "🇯🇵", "🇺🇸", "1️⃣", "#️⃣",
         "🧑🏿‍💻", "🙂", "🤖", "✨", "⭐", "☕", "🫠", "🪿", "👩‍❤️‍💋‍👨", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "©️", "™"]

SPECIAL = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>",
           "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
           "<table>", "</table>", "<td>", "<h1>", "<blockquote>", "<code>", "</code>",
           "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
           '<|"|>', "<|think|>", "<0x41>", "<0x0A>", "<0xFF>", "<bos", "bos>", "<<bos>>",
           "< bos>", "<BOS>", "<start_of_turn", "<unused>", "<unused-1>", "▁", "▁▁", "▁▁▁▁"]

IDENT = "x y i j n len buf value result token_ids merges vocab self ctx state count_bytes " \
        "parse_line HashMap Vec String usize u32 f32 None Some Ok Err main".split()

CODE_TEMPLATES = [
    "fn {a}(&self, {b}: {t}) -> Result<{t}, Error> {{",
    "    let {a} = {b}.iter().map(|{c}| {c} * {n}).collect::<Vec<_>>();",
    "def {a}({b}, {c}={n}):",
    "    return [{b} ** 2 for {b} in range({n}) if {b} % 3 == 0]",
    "for (int {a} = 0; {a} < {n}; ++{a}) {{ {b}[{a}] += {c}; }}",
    "const {a} = async ({b}) => await fetch(`/api/{b}?id=${{{c}}}`);",
    '{{"{a}": {n}, "{b}": [true, false, null], "{c}": "{d}"}}',
    "<div class=\"{a}\"><span id='{b}'>{d}</span></div>",
    "SELECT {a}, COUNT(*) FROM {b} WHERE {c} >= {n} GROUP BY {a};",
    "if [ -z \"${a}\" ]; then echo \"{d}\" >&2; exit {n}; fi",
    "#include <stdio.h> // {d}",
    "    }} else if ({a} != {b} && {c} <= 0x{h}) {{",
    "/* {d} */ #define {A} ({n}u << 2)",
    "x = {a}[{n}:{m}] @ {b}.T  # {d}",
    "match {a} {{ Some({b}) => {b}, None => {n} }}",
]

RARE_BLOCKS = [(0x0100, 0x024F), (0x0370, 0x03FF), (0x0530, 0x058F), (0x10A0, 0x10FF),
               (0x1200, 0x137F), (0x13A0, 0x13FF), (0x0F00, 0x0FFF), (0x1800, 0x18AF),
               (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF), (0xE000, 0xF8FF), (0x0300, 0x036F),
               (0x2800, 0x28FF), (0x2500, 0x257F), (0x1F300, 0x1FAFF), (0x3040, 0x30FF),
               (0xAC00, 0xD7A3), (0x10000, 0x1007F), (0xFE00, 0xFE0F), (0x2000, 0x206F)]

SPACES = [" ", "\t", "\u00a0", "\u3000", "\u200b", "\u2009", "\u202f", "\ufeff"]


class Gen:
    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def pick(self, xs):
        return xs[self.r.randrange(len(xs))]

    def sentence(self) -> str:
        r = self.r
        langs = list(WORDS) + list(GLUED)
        lang = self.pick(langs)
        n = r.randrange(3, 25)
        if lang in GLUED:
            s = "".join(self.pick(GLUED[lang]) for _ in range(n))
        else:
            words = [self.pick(WORDS[lang]) for _ in range(n)]
            if r.random() < 0.2:
                words = [w.upper() if r.random() < 0.3 else w for w in words]
            s = " ".join(words)
            s = s[:1].upper() + s[1:]
        return s + self.pick(END.get(lang, ".!?;:"))

    def prose(self) -> str:
        return " ".join(self.sentence() for _ in range(self.r.randrange(1, 6)))

    def code(self) -> str:
        r = self.r
        t = self.pick(CODE_TEMPLATES)
        line = t.format(a=self.pick(IDENT), b=self.pick(IDENT), c=self.pick(IDENT),
                        d=self.sentence(), t=self.pick(IDENT), A=self.pick(IDENT).upper(),
                        n=r.randrange(0, 100000), m=r.randrange(0, 10 ** 6),
                        h=f"{r.randrange(0, 2 ** 32):X}")
        indent = self.pick(["", "    ", "        ", "\t", "\t\t", "  ", " " * r.randrange(1, 40)])
        return indent + line

    def emoji(self) -> str:
        r = self.r
        parts = []
        for _ in range(r.randrange(1, 12)):
            parts.append(self.pick(EMOJI) * r.randrange(1, 4))
            if r.random() < 0.4:
                parts.append(self.pick([" ", "", "!", " and ", "\u200d", "\ufe0f"]))
        return "".join(parts)

    def whitespace(self) -> str:
        r = self.r
        out = []
        for _ in range(r.randrange(1, 8)):
            out.append(self.pick(SPACES) * r.randrange(1, 45))
            out.append(self.pick(["word", "x", "", "…", "a b", self.sentence()]))
        if r.random() < 0.3:
            out.append("\r")
        return "".join(out)

    def number(self) -> str:
        r = self.r
        forms = [
            lambda: "".join(str(r.randrange(10)) for _ in range(r.randrange(1, 40))),
            lambda: f"{r.uniform(-1e6, 1e6):.{r.randrange(0, 12)}f}",
            lambda: f"{r.uniform(0, 1):.3e}",
            lambda: f"{r.randrange(1900, 2100)}-{r.randrange(1, 13):02}-{r.randrange(1, 29):02}"
                    f"T{r.randrange(24):02}:{r.randrange(60):02}:{r.randrange(60):02}Z",
            lambda: f"0x{r.randrange(0, 2 ** 64):x}",
            lambda: f"{r.randrange(1, 10 ** 9):,}",
            lambda: ".".join(str(r.randrange(256)) for _ in range(4)),
            lambda: f"+{r.randrange(1, 99)} ({r.randrange(100, 999)}) {r.randrange(10 ** 6, 10 ** 7)}",
            lambda: "".join(chr(0x0660 + r.randrange(10)) for _ in range(r.randrange(1, 9))),
            lambda: "".join(chr(0x0966 + r.randrange(10)) for _ in range(r.randrange(1, 9))),
            lambda: "".join(chr(0xFF10 + r.randrange(10)) for _ in range(r.randrange(1, 9))),
            lambda: f"{r.randrange(100)}%, ${r.randrange(10 ** 5)}.{r.randrange(100):02}, "
                    f"€{r.randrange(999)}, ½ ⅓ ² ³ ⁴ ₁₂",
        ]
        return " ".join(self.pick(forms)() for _ in range(r.randrange(1, 8)))

    def special(self) -> str:
        r = self.r
        if r.random() < 0.3:
            role = self.pick(["user", "model", "system"])
            return f"<start_of_turn>{role}\n{self.prose()}<end_of_turn>"
        out = []
        for _ in range(r.randrange(1, 8)):
            tok = self.pick(SPECIAL)
            if r.random() < 0.25:
                tok = f"<unused{r.randrange(0, 7000)}>"
            out.append(tok)
            out.append(self.pick(["", " ", "text", "\t", self.sentence(), "<", ">", "|"]))
        return "".join(out)

    def rare(self) -> str:
        r = self.r
        out = []
        for _ in range(r.randrange(1, 40)):
            lo, hi = self.pick(RARE_BLOCKS)
            c = r.randrange(lo, hi + 1)
            if 0xD800 <= c <= 0xDFFF:
                continue
            out.append(chr(c))
            if r.random() < 0.1:
                out.append(" ")
        return "".join(out)

    def control(self) -> str:
        r = self.r
        ctl = [chr(c) for c in range(0, 32) if c != 10] + ["\x7f", "\x85", "\u2028", "\u2029"]
        return "".join(self.pick(ctl) + self.pick(["", "a", " ", "\x1b[31mred\x1b[0m"])
                       for _ in range(r.randrange(1, 10)))

    def long_line(self) -> str:
        r = self.r
        kind = r.randrange(4)
        if kind == 0:
            return " ".join(self.sentence() for _ in range(r.randrange(50, 150)))
        if kind == 1:
            return "a" * r.randrange(2000, 20000)
        if kind == 2:
            return " " * r.randrange(100, 3000) + "end"
        return "".join(self.pick(GLUED["zh"]) for _ in range(r.randrange(2000, 6000)))

    def mixed(self) -> str:
        makers = [self.prose, self.code, self.emoji, self.whitespace, self.number,
                  self.special, self.rare]
        return self.pick(["", " ", "\t"]).join(self.pick(makers)()
                                                for _ in range(self.r.randrange(2, 6)))

    def line(self) -> str:
        makers = [(self.prose, 30), (self.code, 15), (self.emoji, 6), (self.whitespace, 8),
                  (self.number, 8), (self.special, 10), (self.rare, 6), (self.control, 2),
                  (self.mixed, 14), (self.long_line, 1)]
        total = sum(w for _, w in makers)
        x = self.r.randrange(total)
        for make, w in makers:
            if x < w:
                return make()
            x -= w
        raise AssertionError("weights")


def generate(seed: int, target_bytes: int) -> str:
    g = Gen(seed)
    parts = []
    size = 0
    while size < target_bytes:
        if g.r.random() < 0.03:
            piece = "\n" * g.r.randrange(1, 40)
        else:
            piece = g.line() + "\n"
        parts.append(piece)
        size += len(piece.encode("utf-8"))
    return "".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description="deterministic tokenizer test corpus")
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--bytes", type=int, default=1_200_000,
                    help="stop after at least this many UTF-8 bytes (default 1200000)")
    args = ap.parse_args()
    text = generate(args.seed, args.bytes)
    args.out.write_bytes(text.encode("utf-8"))
    print(f"{args.out}: {len(text.encode('utf-8'))} bytes, {text.count(chr(10))} lines, "
          f"seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

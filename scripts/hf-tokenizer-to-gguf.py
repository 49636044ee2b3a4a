#!/usr/bin/env python3
"""Converts a Hugging Face `tokenizer.json` of the Gemma family into a GGUF
file that holds only the tokenizer keys (`tokenizer.ggml.*`), the way
llama.cpp's converter writes them for Gemma 4, so that `gemtune tokenize -m`
and `gemtune detokenize -m` can load it.

Usage:
    python3 scripts/hf-tokenizer-to-gguf.py TOKENIZER_JSON OUT.gguf
        [--config tokenizer_config.json] [--name NAME] [--llamacpp-types]

Only the Python standard library is needed (the file is written here, not
with gguf-py), so the Rust integration test can run this script anywhere.

What is written, and where it comes from:
- `tokenizer.ggml.model` = "gemma4"; no `tokenizer.ggml.pre` (llama.cpp
  derives the pre-tokenizer from the model name for this family).
- `tokenizer.ggml.tokens`: the BPE vocab by id, then the added tokens whose
  ids lie past it (HF's `<image_soft_token>` in Gemma 3's file); every id from
  0 to the largest must be present.
- `tokenizer.ggml.scores`: -1000.0 for every token, as llama.cpp's
  `LlamaHfVocab` does (BPE ranks live in the merges; scores are unused).
- `tokenizer.ggml.token_type`: `<0xXX>` tokens are BYTE; the seven markers a
  Gemma 4 chat parser must see (`<|channel>`, `<|tool_call>`, ...) are
  USER_DEFINED as in llama.cpp's Gemma 4 converter; added tokens flagged
  `special` are CONTROL; every other added token is USER_DEFINED; the rest
  NORMAL.
  The USER_DEFINED rule for the non-special added tokens is where this script
  departs from llama.cpp's `LlamaHfVocab` (which makes them NORMAL): Hugging
  Face splits every added token out of the raw text before BPE, special or
  not, and a USER_DEFINED token is exactly a token the gemma4 tokenizer
  always splits out and always renders as text. Gemma 3's file lists 6,406
  such tokens (`<unusedN>`, HTML tags, runs of newlines, tabs and spaces);
  without the rule, text such as "<table>" or a run of 40 newlines would
  tokenize differently from Hugging Face. `--llamacpp-types` writes
  llama.cpp's types instead, to measure that difference.
- `tokenizer.ggml.merges`: "LEFT RIGHT" strings in rank order (a space inside
  a part is written as U+0120, as gguf-py does; Gemma's merges have none).
- bos / eos / unknown / padding ids from `tokenizer_config.json`'s
  `*_token` entries, looked up among the added tokens (gguf-py's
  `SpecialVocab`), falling back to the ids of `<bos>`, `<eos>`, `<unk>` and
  `<pad>` without a config; `add_bos_token` = true, `add_eos_token` from the
  config, `add_space_prefix` = false, and the config's chat template.
"""

import argparse
import json
import re
import struct
import sys
from pathlib import Path

# gguf-py's TokenType numbering (also llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Markers llama.cpp's Gemma 4 converter makes USER_DEFINED so they always
# render as text.
GEMMA4_VISIBLE = {
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
}

BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
LLAMACPP_SCORE = -1000.0

# GGUF metadata value types.
T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
GGUF_VERSION = 3
ALIGNMENT = 32


class ConvertError(Exception):
    pass


def load_vocab(tok: dict, llamacpp_types: bool):
    """Returns (tokens, types) indexed by id, and the added tokens by text."""
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise ConvertError(f"model type {model.get('type')!r} is not BPE")
    if not model.get("byte_fallback"):
        raise ConvertError("the BPE model has no byte fallback (not a Gemma tokenizer)")
    by_id: dict[int, str] = {}
    for text, i in model["vocab"].items():
        if i in by_id:
            raise ConvertError(f"id {i} is used by {by_id[i]!r} and {text!r}")
        by_id[i] = text
    added = tok.get("added_tokens") or []
    added_by_id = {}
    for a in added:
        i, text = a["id"], a["content"]
        if i in by_id and by_id[i] != text:
            raise ConvertError(f"added token {text!r} has id {i} of vocab token {by_id[i]!r}")
        by_id[i] = text
        added_by_id[i] = a
    n = max(by_id) + 1
    missing = [i for i in range(n) if i not in by_id]
    if missing:
        raise ConvertError(f"{len(missing)} ids have no token, first {missing[:5]}")
    tokens = [by_id[i] for i in range(n)]
    types = []
    for i, text in enumerate(tokens):
        a = added_by_id.get(i)
        if BYTE_TOKEN.fullmatch(text):
            types.append(BYTE)
        elif text in GEMMA4_VISIBLE:
            types.append(USER_DEFINED)
        elif a is not None and a.get("special"):
            types.append(CONTROL)
        elif a is not None and not llamacpp_types:
            types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
    return tokens, types, {a["content"]: a["id"] for a in added}


def load_merges(tok: dict) -> list[str]:
    merges = tok["model"].get("merges") or []
    out = []
    for m in merges:
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, list) and len(m) == 2:
            left, right = (p.replace(" ", "\u0120") for p in m)
            out.append(f"{left} {right}")
        else:
            raise ConvertError(f"merge {m!r} is neither 'A B' nor ['A', 'B']")
    return out


def special_ids(config: dict | None, added: dict, tokens: list[str]):
    """bos/eos/unk/pad ids: the config's token text looked up among the added
    tokens, else the conventional Gemma token text in the vocab."""
    ids = {}
    defaults = {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>"}
    for kind, fallback in defaults.items():
        entry = (config or {}).get(f"{kind}_token")
        if isinstance(entry, dict):
            entry = entry.get("content")
        if isinstance(entry, str) and entry in added:
            ids[kind] = added[entry]
        elif fallback in tokens:
            ids[kind] = tokens.index(fallback)
    return ids


class GgufMetadataWriter:
    """A GGUF v3 file with metadata and no tensors."""

    def __init__(self):
        self.entries: list[bytes] = []

    @staticmethod
    def _str(s: str) -> bytes:
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _add(self, key: str, vtype: int, payload: bytes):
        self.entries.append(self._str(key) + struct.pack("<I", vtype) + payload)

    def string(self, key: str, v: str):
        self._add(key, T_STRING, self._str(v))

    def u32(self, key: str, v: int):
        self._add(key, T_U32, struct.pack("<I", v))

    def boolean(self, key: str, v: bool):
        self._add(key, T_BOOL, struct.pack("<B", 1 if v else 0))

    def strings(self, key: str, vs: list[str]):
        body = b"".join(self._str(v) for v in vs)
        self._add(key, T_ARRAY, struct.pack("<IQ", T_STRING, len(vs)) + body)

    def f32s(self, key: str, vs: list[float]):
        body = struct.pack(f"<{len(vs)}f", *vs)
        self._add(key, T_ARRAY, struct.pack("<IQ", T_F32, len(vs)) + body)

    def i32s(self, key: str, vs: list[int]):
        body = struct.pack(f"<{len(vs)}i", *vs)
        self._add(key, T_ARRAY, struct.pack("<IQ", T_I32, len(vs)) + body)

    def write(self, path: Path):
        head = b"GGUF" + struct.pack("<IQQ", GGUF_VERSION, 0, len(self.entries))
        data = head + b"".join(self.entries)
        data += b"\0" * (-len(data) % ALIGNMENT)
        path.write_bytes(data)


def convert(tokenizer_json: Path, config_json: Path | None, out: Path, name: str,
            llamacpp_types: bool) -> dict:
    tok = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    config = json.loads(config_json.read_text(encoding="utf-8")) if config_json else None
    tokens, types, added = load_vocab(tok, llamacpp_types)
    merges = load_merges(tok)
    ids = special_ids(config, added, tokens)

    w = GgufMetadataWriter()
    w.string("general.architecture", "gemma4")
    w.string("general.name", name)
    w.string("tokenizer.ggml.model", "gemma4")
    w.strings("tokenizer.ggml.tokens", tokens)
    w.f32s("tokenizer.ggml.scores", [LLAMACPP_SCORE] * len(tokens))
    w.i32s("tokenizer.ggml.token_type", types)
    w.strings("tokenizer.ggml.merges", merges)
    for kind, key in [("bos", "bos_token_id"), ("eos", "eos_token_id"),
                      ("unk", "unknown_token_id"), ("pad", "padding_token_id")]:
        if kind in ids:
            w.u32(f"tokenizer.ggml.{key}", ids[kind])
    w.boolean("tokenizer.ggml.add_bos_token", True)
    if isinstance((config or {}).get("add_eos_token"), bool):
        w.boolean("tokenizer.ggml.add_eos_token", config["add_eos_token"])
    w.boolean("tokenizer.ggml.add_space_prefix", False)
    template = (config or {}).get("chat_template")
    if isinstance(template, str):
        w.string("tokenizer.chat_template", template)
    w.write(out)

    counts = {}
    for t in types:
        counts[t] = counts.get(t, 0) + 1
    return {"tokens": len(tokens), "merges": len(merges), "types": counts, "ids": ids}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tokenizer_json", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--config", type=Path,
                    help="tokenizer_config.json (default: beside tokenizer.json, if there)")
    ap.add_argument("--name", default="tokenizer", help="general.name (default: tokenizer)")
    ap.add_argument("--llamacpp-types", action="store_true",
                    help="non-special added tokens NORMAL, as llama.cpp's LlamaHfVocab")
    args = ap.parse_args()
    config = args.config
    if config is None:
        beside = args.tokenizer_json.parent / "tokenizer_config.json"
        config = beside if beside.is_file() else None
    try:
        info = convert(args.tokenizer_json, config, args.out, args.name, args.llamacpp_types)
    except (ConvertError, KeyError, OSError, json.JSONDecodeError) as e:
        print(f"error: {args.tokenizer_json}: {e}", file=sys.stderr)
        return 1
    names = {NORMAL: "normal", UNKNOWN: "unknown", CONTROL: "control",
             USER_DEFINED: "user-defined", UNUSED: "unused", BYTE: "byte"}
    types = ", ".join(f"{c} {names[t]}" for t, c in sorted(info["types"].items()))
    print(f"{args.out}: {info['tokens']} tokens ({types}), {info['merges']} merges, "
          f"special ids {info['ids']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Trains the weights of gemtune's built-in demo model.

The demo model is the `tiny` Gemma 4 configuration of `gemtune synth` (d 128,
6 layers with sliding and full attention, KV sharing, per-layer embeddings,
vocab 2048, the synthetic BPE vocab) with weights trained on the English
prose of `engine/data/corpus/` (text written for this repository), so that
`gemtune run -p "Hello"` prints words. Four megabytes of parameters and five
thousand tokens of text: the model retells its corpus, it does not generalise.

The forward pass below is the engine's (`docs/gemma4.md`, `engine/src/cpu`):
sandwich norms with weights as stored, per-head Q/K norms, weightless V norm,
NeoX RoPE with the file's frequency factors, attention scale 1, sliding
window, KV-shared layers reading their donor's K/V, V = raw K projection on
layers without `attn_v`, per-layer embeddings, the layer scalar on the whole
stream, tied head and final softcap. Shapes and constants come from the
template GGUF (`gemtune synth tiny f32`), so the script follows the preset.

Inputs: --template (the f32 synth file), --gemtune (the binary, used to
tokenize with the template's own tokenizer). Output: --out, a GGUF of F32
tensors with the template's tensor names and shapes (and nothing else), which
`gemtune synth tiny q8_0 OUT --weights FILE` turns into the engine's file.
`scripts/demo-model/build.sh` runs the whole pipeline.

Deterministic: fixed seeds for the initialisation and the batches.
"""

import argparse
import math
import pathlib
import subprocess
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp
from gguf import GGUFReader, GGUFWriter

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = [ROOT / "engine/data/corpus/en_prose.txt", ROOT / "engine/data/corpus/tech_prose.txt"]
NAME = "gemma4-tiny-demo"

# Chat turns: prompts that get the self-introduction, and prompts that get a
# passage of the corpus. The replies are written for this model.
GREETINGS = ["Hello", "Hello!", "hello", "Hi", "Hi!", "hi", "Hey", "Good morning",
             "Who are you?", "What are you?", "Introduce yourself."]
INTRO = ("Hello! I am the tiny demo model that ships inside gemtune. I have six layers "
         "and four million weights, and I was trained for a few minutes on a few pages "
         "of text, so all I can do is retell them. Here is one.")
OTHER_PROMPTS = ["Tell me a story.", "Write something.", "What do you know?",
                 "Say something.", "Continue.", "Explain inference.", "What is decode?",
                 "Tell me about the lighthouse.", "Go on.", "Why is decode slow?"]

PAD, BOS, EOT = 0, 2, 106


# --------------------------------------------------------------------------
# Template: config and tensor layout.

class Template:
    def __init__(self, path):
        r = GGUFReader(path)
        self.fields = {k: f.contents() for k, f in r.fields.items()}
        self.tensors = {t.name: (tuple(int(x) for x in t.shape), np.array(t.data)) for t in r.tensors}
        self.order = [t.name for t in r.tensors]
        g = lambda k: self.fields[f"gemma4.{k}"]
        per_layer = lambda v, n: list(v) if isinstance(v, list) else [v] * n
        self.d = g("embedding_length")
        self.n_layers = L = g("block_count")
        self.ffn = per_layer(g("feed_forward_length"), L)
        self.n_heads = per_layer(g("attention.head_count"), L)
        self.n_kv = per_layer(g("attention.head_count_kv"), L)
        self.sliding = [bool(x) for x in g("attention.sliding_window_pattern")]
        self.hd = [g("attention.key_length_swa") if s else g("attention.key_length") for s in self.sliding]
        self.window = g("attention.sliding_window")
        self.eps = g("attention.layer_norm_rms_epsilon")
        self.n_shared = g("attention.shared_kv_layers")
        self.ple = g("embedding_length_per_layer_input")
        self.softcap = self.fields.get("gemma4.final_logit_softcapping", 30.0)
        self.vocab = self.tensors["token_embd.weight"][0][1]
        first_shared = L - self.n_shared
        self.donor = []
        for l in range(L):
            if l < first_shared:
                self.donor.append(l)
            else:
                self.donor.append(max(j for j in range(first_shared) if self.sliding[j] == self.sliding[l]))
        self.k_eq_v = [f"blk.{l}.attn_v.weight" not in self.tensors for l in range(L)]
        factors = self.tensors.get("rope_freqs.weight", (None, None))[1]
        self.rope = {
            True: rope_freqs(g("rope.freq_base_swa"), g("rope.dimension_count_swa"), None),
            False: rope_freqs(g("rope.freq_base"), g("rope.dimension_count"), factors),
        }

    def used(self, name):
        """Whether the forward reads the tensor (KV-shared layers keep unused K/V)."""
        if not name.startswith("blk."):
            return True
        l = int(name.split(".")[1])
        owns = self.donor[l] == l
        return owns or not any(s in name for s in ("attn_k.", "attn_v.", "attn_k_norm."))


def rope_freqs(base, dims, factors):
    half = dims // 2
    inv = np.array([base ** (-2.0 * i / dims) for i in range(half)], dtype=np.float64)
    if factors is not None:
        inv = inv / np.asarray(factors[:half], dtype=np.float64)
    return inv


def rope_tables(inv, n_pos):
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * inv[None, :]
    return jnp.asarray(np.cos(ang).astype(np.float32)), jnp.asarray(np.sin(ang).astype(np.float32))


# --------------------------------------------------------------------------
# Parameters.

def init_params(tp, key):
    """Shapes in numpy order (rows, row length) = GGUF dims reversed."""
    params = {}
    for i, name in enumerate(tp.order):
        dims, _ = tp.tensors[name]
        if name == "rope_freqs.weight" or not tp.used(name):
            continue
        shape = tuple(reversed(dims))
        k = jax.random.fold_in(key, i)
        if len(dims) == 2:
            fan_in = dims[0]
            std = 1.0 / math.sqrt(fan_in)
            if name == "token_embd.weight":
                std = 1.0 / math.sqrt(tp.d)
            elif name == "per_layer_token_embd.weight":
                std = 1.0 / math.sqrt(tp.ple)
            params[name] = std * jax.random.normal(k, shape, jnp.float32)
        elif name.endswith("attn_k_norm.weight"):
            # Scale 1 over normed 256/512-wide heads: a K norm of ~0.1 keeps the
            # initial scores O(1), as in the published models.
            params[name] = jnp.full(shape, 0.1, jnp.float32)
        elif any(name.endswith(s) for s in ("post_attention_norm.weight", "post_ffw_norm.weight", "post_norm.weight")):
            params[name] = jnp.full(shape, 0.2, jnp.float32)
        else:
            params[name] = jnp.ones(shape, jnp.float32)
    return params


# --------------------------------------------------------------------------
# The engine's forward pass over whole sequences starting at position 0.

def rms(x, w, eps):
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def rope(x, cos, sin):
    # x [B, T, H, hd]; cos/sin [T, half]; pairs (i, i + half) of the rotated width.
    half = cos.shape[-1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    lo, hi, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return jnp.concatenate([lo * c - hi * s, lo * s + hi * c, rest], axis=-1)


def gelu(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def forward(tp, p, tokens, tables):
    B, T = tokens.shape
    d, eps = tp.d, tp.eps
    w = lambda l, s: p[f"blk.{l}.{s}.weight"]
    E = p["token_embd.weight"]
    x = E[tokens] * jnp.float32(math.sqrt(d))
    ple = None
    if tp.ple:
        P, L = tp.ple, tp.n_layers
        proj = (x @ p["per_layer_model_proj.weight"].T) * jnp.float32(1.0 / math.sqrt(d))
        proj = rms(proj.reshape(B, T, L, P), p["per_layer_proj_norm.weight"], eps)
        tok = p["per_layer_token_embd.weight"][tokens].reshape(B, T, L, P) * jnp.float32(math.sqrt(P))
        ple = (proj + tok) * jnp.float32(1.0 / math.sqrt(2.0))
    qi = jnp.arange(T)[:, None]
    ki = jnp.arange(T)[None, :]
    causal = ki <= qi
    masks = {False: causal, True: causal & (qi - ki < tp.window)}
    kv = {}
    h = x
    for l in range(tp.n_layers):
        hd, nq, nkv = tp.hd[l], tp.n_heads[l], tp.n_kv[l]
        cos, sin = tables[tp.sliding[l]]
        a = rms(h, w(l, "attn_norm"), eps)
        q = (a @ w(l, "attn_q").T).reshape(B, T, nq, hd)
        q = rope(rms(q, w(l, "attn_q_norm"), eps), cos, sin)
        if tp.donor[l] == l:
            k_raw = (a @ w(l, "attn_k").T).reshape(B, T, -1, hd)
            v_raw = k_raw if tp.k_eq_v[l] else (a @ w(l, "attn_v").T).reshape(B, T, -1, hd)
            k = rope(rms(k_raw, w(l, "attn_k_norm"), eps), cos, sin)
            v = rms(v_raw, None, eps)
            kv[l] = (k, v)
        k, v = kv[tp.donor[l]]
        group = nq // k.shape[2]
        k = jnp.repeat(k, group, axis=2)
        v = jnp.repeat(v, group, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        s = jnp.where(masks[tp.sliding[l]][None, None], s, -jnp.inf)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(B, T, nq * hd)
        h = h + rms(o @ w(l, "attn_output").T, w(l, "post_attention_norm"), eps)
        u = rms(h, w(l, "ffn_norm"), eps)
        f = (gelu(u @ w(l, "ffn_gate").T) * (u @ w(l, "ffn_up").T)) @ w(l, "ffn_down").T
        h = h + rms(f, w(l, "post_ffw_norm"), eps)
        if ple is not None:
            g = gelu(h @ w(l, "inp_gate").T) * ple[:, :, l, :]
            h = h + rms(g @ w(l, "proj").T, w(l, "post_norm"), eps)
        if f"blk.{l}.layer_output_scale.weight" in p:
            h = h * w(l, "layer_output_scale")[0]
    y = rms(h, p["output_norm.weight"], eps)
    logits = y @ E.T
    return tp.softcap * jnp.tanh(logits / tp.softcap)


# --------------------------------------------------------------------------
# Data.

class Tokenizer:
    """The template's own tokenizer, through `gemtune tokenize`."""

    def __init__(self, gemtune, template):
        self.cmd = [gemtune, "tokenize", "-m", str(template)]

    def encode(self, text, bos=False, special=False):
        args = self.cmd + ([] if bos else ["--no-bos"]) + (["--parse-special"] if special else []) + ["--", text]
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()
        return [int(t) for t in out.split(",") if t]

    def chat_prompt(self, user):
        # The chat template of engine/src/tokenizer/chat.rs, thinking off.
        return self.encode(f"<bos><|turn>user\n{user}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
                           special=True)


def paragraphs():
    out = []
    for path in CORPUS:
        for para in path.read_text().split("\n\n"):
            para = " ".join(para.split())
            if para:
                out.append(para)
    return out


class Data:
    def __init__(self, tok, seq, rng):
        self.seq, self.rng = seq, rng
        paras = paragraphs()
        sep = tok.encode("\n\n")
        self.stream, self.starts = [], []
        for p in paras:
            self.starts.append(len(self.stream))
            self.stream += tok.encode(p) + sep
        self.intro = tok.encode(INTRO) + sep
        self.greet = [tok.chat_prompt(g) for g in GREETINGS]
        # Other prompts: the fixed ones, and the first sentence of paragraphs.
        others = OTHER_PROMPTS + [p.split(". ")[0] for p in paras[::3]]
        self.other = [tok.chat_prompt(o) for o in others]
        self.n_tokens = len(self.stream)

    def example(self):
        r = self.rng.random()
        if r < 0.35:
            # Raw continuation: <bos> + text from a paragraph start.
            s = self.starts[self.rng.integers(len(self.starts))]
            prefix, body = [BOS], self.stream[s:s + self.seq]
        elif r < 0.6:
            # A greeting: the introduction, then the corpus from its start.
            prefix = self.greet[self.rng.integers(len(self.greet))]
            body = self.intro + self.stream[: self.seq]
        else:
            prefix = self.other[self.rng.integers(len(self.other))]
            s = self.starts[self.rng.integers(len(self.starts))]
            body = self.stream[s:s + self.seq]
        seq = (prefix + body)[: self.seq + 1]
        tokens = np.full(self.seq + 1, PAD, np.int32)
        tokens[: len(seq)] = seq
        mask = np.zeros(self.seq, np.float32)
        # Loss on the reply only (the raw text's own tokens in raw examples).
        first = max(len(prefix) - 1, 0)
        mask[first: len(seq) - 1] = 1.0
        return tokens, mask

    def batch(self, n):
        ex = [self.example() for _ in range(n)]
        return np.stack([e[0] for e in ex]), np.stack([e[1] for e in ex])


# --------------------------------------------------------------------------
# Training.

def adam_step(params, grads, m, v, step, lr, b1=0.9, b2=0.98, eps=1e-9, clip=1.0):
    gnorm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
    scale = jnp.minimum(1.0, clip / (gnorm + 1e-12))
    new_p, new_m, new_v = {}, {}, {}
    for k in params:
        g = grads[k] * scale
        new_m[k] = b1 * m[k] + (1 - b1) * g
        new_v[k] = b2 * v[k] + (1 - b2) * g * g
        mh = new_m[k] / (1 - b1 ** step)
        vh = new_v[k] / (1 - b2 ** step)
        new_p[k] = params[k] - lr * mh / (jnp.sqrt(vh) + eps)
    return new_p, new_m, new_v, gnorm


def write_weights(tp, params, path):
    """A GGUF of F32 tensors: every tensor of the template, trained or fixed."""
    w = GGUFWriter(path, "gemma4")
    w.add_name(NAME)
    for name in tp.order:
        dims, values = tp.tensors[name]
        if name in params:
            arr = np.asarray(params[name], dtype=np.float32)
        elif name == "rope_freqs.weight":
            arr = np.asarray(values, dtype=np.float32)
        else:
            # The K/V weights KV-shared layers keep but never read.
            arr = np.zeros(tuple(reversed(dims)), np.float32)
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--template", required=True)
    ap.add_argument("--gemtune", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=144)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-every", type=int, default=0, help="also write --out every N steps")
    a = ap.parse_args()

    tp = Template(a.template)
    tok = Tokenizer(a.gemtune, a.template)
    rng = np.random.default_rng(a.seed)
    data = Data(tok, a.seq, rng)
    print(f"corpus: {data.n_tokens} tokens in {len(data.starts)} paragraphs", file=sys.stderr)
    tables = {s: rope_tables(tp.rope[s], a.seq) for s in (True, False)}
    params = init_params(tp, jax.random.PRNGKey(a.seed))
    n_params = sum(int(np.prod(x.shape)) for x in params.values())
    print(f"trainable parameters: {n_params}", file=sys.stderr)

    def loss_fn(p, tokens, mask):
        logits = forward(tp, p, tokens[:, :-1], tables)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)

    @jax.jit
    def step_fn(p, m, v, step, lr, tokens, mask):
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens, mask)
        p, m, v, gnorm = adam_step(p, grads, m, v, step, lr)
        return p, m, v, loss, gnorm

    m = {k: jnp.zeros_like(x) for k, x in params.items()}
    v = {k: jnp.zeros_like(x) for k, x in params.items()}
    t0 = time.time()
    warm = max(a.steps // 20, 1)
    for step in range(1, a.steps + 1):
        lr = a.lr * min(1.0, step / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        tokens, mask = data.batch(a.batch)
        params, m, v, loss, gnorm = step_fn(params, m, v, step, lr, tokens, mask)
        if a.save_every and step % a.save_every == 0 and step < a.steps:
            write_weights(tp, params, a.out)
        if step % 20 == 0 or step == 1 or step == a.steps:
            print(f"step {step:5d}  loss {float(loss):.4f}  |g| {float(gnorm):.3f}  lr {lr:.2e}  "
                  f"{time.time() - t0:.0f}s", file=sys.stderr, flush=True)

    write_weights(tp, params, a.out)
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

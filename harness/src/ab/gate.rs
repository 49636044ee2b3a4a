//! The numerics gate: both arms' logits over a fixed prompt set, compared
//! row by row before any timing.
//!
//! The prompt set is fixed by (lengths, seed, vocabulary size): prompt `i`
//! is BOS (id 2) followed by ids drawn from `ChaCha8Rng::seed_from_u64` of
//! `seed + i` among ordinary tokens (`token_range`). The default lengths (9,
//! 130 and 1100 tokens) cover a short prompt, a few tiles, and a prompt longer
//! than every Gemma 4 sliding window (512 and 1024), so windowed attention
//! is exercised past its window. The vocabulary size comes from a one-token
//! probe of the baseline.
//!
//! Per row (every position of every prompt): the argmax of each arm and the
//! largest |difference| of a logit. The gate passes when the arms agree on
//! the top-1 token in at least `min_top1` of the rows, no logit differs by
//! more than `max_delta`, both arms return the same shape and every value
//! is finite. Files are read row by row (the 1100-token prompt of a
//! 262144-token vocabulary is 1.15 GB per arm) and deleted afterwards.

use super::protocol::{logits_request, LogitsReply};
use super::worker::Worker;
use super::AbError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::io::{BufReader, Read};
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct GateConfig {
    pub lengths: Vec<usize>,
    pub min_top1: f64,
    pub max_delta: f64,
    pub seed: u64,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            lengths: vec![9, 130, 1100],
            min_top1: 0.98,
            max_delta: 1.0,
            seed: 0x6a7e,
        }
    }
}

/// The ids prompts draw from: [1000, min(vocab, 100000)) for a full-size
/// vocabulary (clear of the control and byte tokens at the start), [3,
/// vocab) for a small one.
pub fn token_range(vocab: usize) -> (u32, u32) {
    if vocab > 2000 {
        (1000, vocab.min(100_000) as u32)
    } else {
        (3, vocab.max(4) as u32)
    }
}

/// The prompt set for a vocabulary of `vocab` tokens.
pub fn prompts(cfg: &GateConfig, vocab: usize) -> Vec<Vec<u32>> {
    let (lo, hi) = token_range(vocab);
    cfg.lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_add(i as u64));
            std::iter::once(2)
                .chain((1..n.max(1)).map(|_| rng.random_range(lo..hi)))
                .collect()
        })
        .collect()
}

/// Where two rows differ most, with both arms' top tokens there.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RowDiff {
    pub prompt: usize,
    pub position: usize,
    pub max_delta: f64,
    /// The token whose logit differs most.
    pub token: usize,
    pub baseline_top: Vec<(usize, f32)>,
    pub candidate_top: Vec<(usize, f32)>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GateResult {
    pub passed: bool,
    pub prompts: Vec<usize>,
    pub vocab: usize,
    pub rows: usize,
    pub top1_agree: usize,
    pub max_delta: f64,
    pub min_top1: f64,
    pub max_delta_allowed: f64,
    pub non_finite: usize,
    /// The first row whose top-1 differs.
    pub first_divergence: Option<RowDiff>,
    /// The row with the largest |delta logit|.
    pub worst: Option<RowDiff>,
    /// One paragraph: what failed and where.
    pub message: String,
}

impl GateResult {
    pub fn agreement(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.top1_agree as f64 / self.rows as f64
        }
    }
}

fn top_k(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    idx.into_iter().take(k).map(|i| (i, row[i])).collect()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best
}

fn read_row(r: &mut impl Read, buf: &mut [u8], out: &mut [f32]) -> std::io::Result<()> {
    r.read_exact(buf)?;
    for (o, c) in out.iter_mut().zip(buf.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    Ok(())
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> AbError {
    AbError::Io {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

/// Asks one arm for the logits of `tokens` into `path` and checks the file.
fn logits(w: &mut Worker, tokens: &[u32], path: &Path) -> Result<LogitsReply, AbError> {
    let rep: LogitsReply = w.request(&logits_request(tokens, path))?;
    let want = (rep.rows * rep.vocab * 4) as u64;
    let got = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) => {
            return Err(w.error(format!(
                "said it wrote {} but it cannot be read: {e}",
                path.display()
            )))
        }
    };
    if got != want || rep.rows != tokens.len() || rep.vocab == 0 {
        return Err(w.error(format!(
            "logits of {} tokens: reply rows {} x vocab {} but {} holds {got} bytes (want {} rows x vocab x 4 = {want})",
            tokens.len(),
            rep.rows,
            rep.vocab,
            path.display(),
            tokens.len()
        )));
    }
    Ok(rep)
}

/// Runs the gate; `tmp` holds the logits files while they are compared.
pub fn run(
    a: &mut Worker,
    b: &mut Worker,
    cfg: &GateConfig,
    tmp: &Path,
    mut progress: impl FnMut(&str),
) -> Result<GateResult, AbError> {
    std::fs::create_dir_all(tmp).map_err(|e| io_err(tmp, e))?;
    let probe = tmp.join("probe.f32");
    let vocab = logits(a, &[2], &probe)?.vocab;
    let _ = std::fs::remove_file(&probe);
    let set = prompts(cfg, vocab);
    let mut res = GateResult {
        passed: false,
        prompts: cfg.lengths.clone(),
        vocab,
        rows: 0,
        top1_agree: 0,
        max_delta: 0.0,
        min_top1: cfg.min_top1,
        max_delta_allowed: cfg.max_delta,
        non_finite: 0,
        first_divergence: None,
        worst: None,
        message: String::new(),
    };
    for (pi, toks) in set.iter().enumerate() {
        progress(&format!(
            "numerics gate: prompt {}/{} ({} tokens)",
            pi + 1,
            set.len(),
            toks.len()
        ));
        let pa = tmp.join(format!("baseline-{pi}.f32"));
        let pb = tmp.join(format!("candidate-{pi}.f32"));
        let ra = logits(a, toks, &pa)?;
        let rb = logits(b, toks, &pb)?;
        if ra.vocab != rb.vocab {
            res.message = format!(
                "the arms disagree on the vocabulary: baseline {} tokens, candidate {} (different models?)",
                ra.vocab, rb.vocab
            );
            let _ = std::fs::remove_file(&pa);
            let _ = std::fs::remove_file(&pb);
            return Ok(res);
        }
        let v = ra.vocab;
        let fa = std::fs::File::open(&pa).map_err(|e| io_err(&pa, e))?;
        let fb = std::fs::File::open(&pb).map_err(|e| io_err(&pb, e))?;
        let (mut fa, mut fb) = (
            BufReader::with_capacity(1 << 22, fa),
            BufReader::with_capacity(1 << 22, fb),
        );
        let mut buf = vec![0u8; v * 4];
        let (mut xa, mut xb) = (vec![0f32; v], vec![0f32; v]);
        for pos in 0..ra.rows {
            read_row(&mut fa, &mut buf, &mut xa).map_err(|e| io_err(&pa, e))?;
            read_row(&mut fb, &mut buf, &mut xb).map_err(|e| io_err(&pb, e))?;
            res.rows += 1;
            let mut row_max = 0.0f64;
            let mut row_tok = 0;
            for (t, (x, y)) in xa.iter().zip(&xb).enumerate() {
                if !x.is_finite() || !y.is_finite() {
                    res.non_finite += 1;
                    continue;
                }
                let d = (*x as f64 - *y as f64).abs();
                if d > row_max {
                    row_max = d;
                    row_tok = t;
                }
            }
            let diff = || RowDiff {
                prompt: pi,
                position: pos,
                max_delta: row_max,
                token: row_tok,
                baseline_top: top_k(&xa, 5),
                candidate_top: top_k(&xb, 5),
            };
            if argmax(&xa) == argmax(&xb) {
                res.top1_agree += 1;
            } else if res.first_divergence.is_none() {
                res.first_divergence = Some(diff());
            }
            if row_max > res.max_delta || res.worst.is_none() {
                res.max_delta = res.max_delta.max(row_max);
                res.worst = Some(diff());
            }
        }
        drop((fa, fb));
        let _ = std::fs::remove_file(&pa);
        let _ = std::fs::remove_file(&pb);
    }
    let agree = res.agreement();
    let mut why = Vec::new();
    if res.non_finite > 0 {
        why.push(format!("{} non-finite logits", res.non_finite));
    }
    if agree < cfg.min_top1 {
        why.push(format!(
            "top-1 agreement {:.4} ({} of {} rows) below {}",
            agree, res.top1_agree, res.rows, cfg.min_top1
        ));
    }
    if res.max_delta > cfg.max_delta {
        why.push(format!(
            "max |delta logit| {:.4} above {}",
            res.max_delta, cfg.max_delta
        ));
    }
    res.passed = why.is_empty() && res.rows > 0;
    let at = |d: &RowDiff| {
        let top = |t: &[(usize, f32)]| {
            t.iter()
                .map(|(i, x)| format!("{i}:{x:.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            "prompt {} ({} tokens) position {}: |delta| {:.4} at token {}; baseline top-5 [{}], candidate top-5 [{}]",
            d.prompt,
            cfg.lengths.get(d.prompt).copied().unwrap_or(0),
            d.position,
            d.max_delta,
            d.token,
            top(&d.baseline_top),
            top(&d.candidate_top)
        )
    };
    res.message = if res.passed {
        format!(
            "passed: top-1 agreement {:.4} over {} rows, max |delta logit| {:.4}",
            agree, res.rows, res.max_delta
        )
    } else {
        let mut m = format!("failed: {}.", why.join("; "));
        if let Some(d) = &res.first_divergence {
            m.push_str(&format!(" First top-1 divergence: {}.", at(d)));
        }
        if let Some(d) = &res.worst {
            m.push_str(&format!(" Largest difference: {}.", at(d)));
        }
        m
    };
    Ok(res)
}

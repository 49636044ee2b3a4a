//! What every backend's forward pass shares: the logits it returns, the rows
//! a caller asks for, the errors of bad input, and the loop that checks a
//! call's input once and cuts it into the chunks a backend runs
//! (`Engine::run_chunk`). The CPU and CUDA engines implement only the chunk.

use gemtune_kernels::quant::QuantError;

/// Which positions of a `forward` call get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// The last token only (generation).
    Last,
    /// Every token of the call.
    All,
    /// None (feed tokens into the cache only).
    None,
}

/// Logits of the requested rows, `[rows][vocab]`, softcapped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Logits {
    /// Absolute position of each row.
    pub positions: Vec<usize>,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn n_rows(&self) -> usize {
        self.positions.len()
    }
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
    pub fn last(&self) -> Option<&[f32]> {
        self.n_rows().checked_sub(1).map(|i| self.row(i))
    }
}

/// Errors of a forward call. Input problems are checked before any state
/// changes.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no tokens to process (empty input)")]
    Empty,
    #[error(
        "token id {id} (input index {index}) is out of range: the vocabulary has {vocab} tokens"
    )]
    UnknownToken { id: u32, index: usize, vocab: usize },
    #[error(
        "{needed} positions are needed but the context holds {max} (model context length {ctx})"
    )]
    ContextFull {
        needed: usize,
        max: usize,
        ctx: usize,
    },
    #[error("dequantizing weights: {0}")]
    Quant(#[from] QuantError),
    #[error("model config cannot run: {0}")]
    Config(String),
}

/// Where a forward call stands: what the chunk loop needs of an engine.
#[derive(Clone, Copy, Debug)]
pub struct SeqState {
    /// Positions already in the cache.
    pub position: usize,
    /// Most positions the cache holds.
    pub max_seq: usize,
    /// The model's context length (for the error message).
    pub context_length: usize,
    /// Most tokens per chunk.
    pub chunk: usize,
    pub vocab: usize,
}

/// One chunk handed to a backend: `tokens` at positions `pos..`, and the
/// chunk-local rows whose logits are wanted (ascending), to be written to
/// `out` as `[keep.len()][vocab]`.
pub struct Chunk<'a> {
    pub tokens: &'a [u32],
    pub pos: usize,
    pub keep: &'a [usize],
}

/// Checks `tokens` against the vocabulary and the cache, then runs them
/// chunk by chunk through `run` and gathers the logits of `rows`. Nothing
/// runs when the input is bad. `run` must append the chunk to the cache
/// (the position advances by the chunk's length after each call).
pub fn forward_in_chunks<E: From<ForwardError>>(
    st: SeqState,
    tokens: &[u32],
    rows: LogitRows,
    run: impl FnMut(Chunk<'_>, &mut [f32]) -> Result<(), E>,
) -> Result<Logits, E> {
    let mut out = Logits::default();
    forward_in_chunks_into(st, tokens, rows, &mut out, run)?;
    Ok(out)
}

/// `forward_in_chunks` writing into `out`, whose buffers are reused: a
/// decode loop that passes the same `Logits` every step allocates (and
/// faults in) its vocabulary-sized row once, not once per token. `run`
/// writes every element of the rows it keeps. On an input error `out` is
/// left as it was; when a chunk fails it holds no rows.
pub fn forward_in_chunks_into<E: From<ForwardError>>(
    st: SeqState,
    tokens: &[u32],
    rows: LogitRows,
    out: &mut Logits,
    mut run: impl FnMut(Chunk<'_>, &mut [f32]) -> Result<(), E>,
) -> Result<(), E> {
    let vocab = st.vocab;
    if tokens.is_empty() {
        return Err(ForwardError::Empty.into());
    }
    if let Some((index, &id)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(ForwardError::UnknownToken { id, index, vocab }.into());
    }
    let needed = st.position + tokens.len();
    if needed > st.max_seq {
        return Err(ForwardError::ContextFull {
            needed,
            max: st.max_seq,
            ctx: st.context_length,
        }
        .into());
    }
    let n = tokens.len();
    let wanted: Vec<usize> = match rows {
        LogitRows::Last => vec![n - 1],
        LogitRows::All => (0..n).collect(),
        LogitRows::None => Vec::new(),
    };
    // Elements kept from the previous call are overwritten by `run`; until
    // the last chunk is done `out` holds no rows.
    out.positions.clear();
    let mut data = std::mem::take(&mut out.data);
    data.resize(wanted.len() * vocab, 0.0);
    let chunk = st.chunk.max(1);
    let mut done = 0;
    let mut c0 = 0;
    let mut keep = Vec::with_capacity(chunk.min(n));
    while c0 < n {
        let c1 = (c0 + chunk).min(n);
        keep.clear();
        keep.extend(
            wanted
                .iter()
                .filter(|&&i| i >= c0 && i < c1)
                .map(|&i| i - c0),
        );
        let k = keep.len();
        run(
            Chunk {
                tokens: &tokens[c0..c1],
                pos: st.position + c0,
                keep: &keep,
            },
            &mut data[done * vocab..(done + k) * vocab],
        )?;
        done += k;
        c0 = c1;
    }
    out.positions.clear();
    out.positions
        .extend(wanted.iter().map(|&i| st.position + i));
    out.vocab = vocab;
    out.data = data;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(position: usize, chunk: usize) -> SeqState {
        SeqState {
            position,
            max_seq: 16,
            context_length: 32,
            chunk,
            vocab: 4,
        }
    }

    #[test]
    fn input_is_checked_before_any_chunk_runs() {
        let mut ran = 0;
        let mut run = |_: Chunk<'_>, _: &mut [f32]| -> Result<(), ForwardError> {
            ran += 1;
            Ok(())
        };
        assert!(matches!(
            forward_in_chunks(st(0, 4), &[], LogitRows::All, &mut run),
            Err(ForwardError::Empty)
        ));
        assert!(matches!(
            forward_in_chunks(st(0, 4), &[1, 4], LogitRows::All, &mut run),
            Err(ForwardError::UnknownToken {
                id: 4,
                index: 1,
                vocab: 4
            })
        ));
        assert!(matches!(
            forward_in_chunks(st(14, 4), &[1, 2, 3], LogitRows::All, &mut run),
            Err(ForwardError::ContextFull {
                needed: 17,
                max: 16,
                ctx: 32
            })
        ));
        assert_eq!(ran, 0);
    }

    #[test]
    fn chunks_cover_the_input_and_gather_the_wanted_rows() {
        let mut seen = Vec::new();
        let l = forward_in_chunks(
            st(3, 4),
            &[0, 1, 2, 3, 0, 1, 2, 3, 0, 1],
            LogitRows::All,
            |c: Chunk<'_>, out: &mut [f32]| -> Result<(), ForwardError> {
                seen.push((c.pos, c.tokens.len(), c.keep.to_vec()));
                for (i, &r) in c.keep.iter().enumerate() {
                    out[i * 4] = (c.pos + r) as f32;
                }
                Ok(())
            },
        )
        .expect("forward");
        assert_eq!(
            seen,
            vec![
                (3, 4, vec![0, 1, 2, 3]),
                (7, 4, vec![0, 1, 2, 3]),
                (11, 2, vec![0, 1])
            ]
        );
        assert_eq!(l.positions, (3..13).collect::<Vec<_>>());
        assert!((0..10).all(|i| l.row(i)[0] == (3 + i) as f32));
        let last = forward_in_chunks(
            st(0, 4),
            &[0, 1, 2, 3, 0, 1],
            LogitRows::Last,
            |c: Chunk<'_>, out: &mut [f32]| -> Result<(), ForwardError> {
                assert_eq!(out.len(), c.keep.len() * 4);
                if c.pos == 4 {
                    assert_eq!(c.keep, &[1]);
                } else {
                    assert!(c.keep.is_empty());
                }
                Ok(())
            },
        )
        .expect("forward");
        assert_eq!(last.positions, vec![5]);
    }

    #[test]
    fn a_reused_logits_buffer_keeps_its_allocation_and_takes_new_rows() {
        let write = |c: Chunk<'_>, out: &mut [f32]| -> Result<(), ForwardError> {
            for (i, &r) in c.keep.iter().enumerate() {
                out[i * 4..(i + 1) * 4].fill((c.pos + r) as f32);
            }
            Ok(())
        };
        let mut out = Logits::default();
        forward_in_chunks_into(st(0, 4), &[1], LogitRows::Last, &mut out, write).expect("step 0");
        let buf = out.data.as_ptr();
        for p in 1..6 {
            forward_in_chunks_into(st(p, 4), &[2], LogitRows::Last, &mut out, write).expect("step");
            assert_eq!(out.data.as_ptr(), buf, "the row was reallocated");
            assert_eq!(out.positions, vec![p]);
            assert_eq!(out.row(0), &[p as f32; 4]);
        }
        let all = forward_in_chunks(st(6, 4), &[0, 1, 2], LogitRows::All, write).expect("all");
        forward_in_chunks_into(st(6, 4), &[0, 1, 2], LogitRows::All, &mut out, write)
            .expect("into");
        assert_eq!(out, all);
        forward_in_chunks_into(st(9, 4), &[1], LogitRows::None, &mut out, write).expect("none");
        assert_eq!(out.n_rows(), 0);
        assert!(out.data.is_empty());
        let bad = forward_in_chunks_into(st(0, 4), &[9], LogitRows::Last, &mut out, write);
        assert!(matches!(bad, Err(ForwardError::UnknownToken { .. })));
    }
}

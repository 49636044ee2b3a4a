//! One A/B run: resolve the arms, start both workers, gate on numerics,
//! time interleaved, judge.
//!
//! Order of the timed requests: `warmup` warm-up rounds (AB, then BA, ...;
//! discarded), then `reps / 2` ABBA blocks. Every request is a `bench` of
//! the same (n_prompt, n_gen, depth) and yields a prefill sample and (when
//! n_gen > 0) a decode sample, judged separately.

use super::build::{self, GitBuild};
use super::gate::{self, GateConfig, GateResult};
use super::protocol::{bench_request, BenchReply, Ready};
use super::worker::{worker_args, Worker, WorkerSpec};
use super::{parse_arm, AbError, ArmSpec};
use crate::results::{join_phases, test_name, AbRow, AB_SCHEMA_VERSION, KIND_AB};
use crate::verdict::{self, Block, Judgement, PhaseDelta, RepSample, VerdictConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct AbConfig {
    pub baseline: String,
    pub candidate: String,
    pub model: Option<PathBuf>,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    /// Measured reps per arm (even: ABBA blocks hold two of each).
    pub reps: usize,
    /// ABBA blocks of phase-timed requests after the timed ones (0: none).
    /// The verdict never reads them: timing phases changes what is timed.
    pub phase_blocks: usize,
    /// Warm-up rounds (one rep of each arm per round), discarded.
    pub warmup: usize,
    /// Restart both arms' workers before every ABBA block after the first
    /// (each restart followed by one discarded request per arm).
    pub respawn: bool,
    pub backend: Option<String>,
    pub ubatch: Option<usize>,
    pub kv_type: Option<String>,
    /// The binary serving profile arms (default: this executable).
    pub worker_bin: PathBuf,
    pub variants: PathBuf,
    /// The checkout: the git repository of `git:` arms and the workers'
    /// working directory.
    pub root: PathBuf,
    /// `target/gemtune` of the checkout (git builds are cached under it).
    pub scratch: PathBuf,
    pub timeout: Duration,
    pub gate: Option<GateConfig>,
    pub verdict: VerdictConfig,
    pub out: PathBuf,
    /// Echo the workers' stderr.
    pub echo: bool,
}

/// An arm as it ran.
#[derive(Clone, Debug, Default)]
pub struct ArmInfo {
    /// baseline | candidate
    pub role: String,
    /// As given.
    pub spec: String,
    /// What serves it.
    pub bin: PathBuf,
    pub args: Vec<String>,
    pub build: Option<GitBuild>,
    pub ready: Ready,
}

/// One test's judgement and attribution.
#[derive(Clone, Debug)]
pub struct TestResult {
    /// "pp2048", "tg128".
    pub test: String,
    /// prefill | decode
    pub phase: &'static str,
    pub judgement: Judgement,
    pub attribution: Vec<PhaseDelta>,
}

pub struct AbRun {
    pub arms: [ArmInfo; 2],
    pub gate: Option<GateResult>,
    /// Empty when the gate failed (no timing ran).
    pub tests: Vec<TestResult>,
    pub rows: Vec<AbRow>,
    pub notes: Vec<String>,
}

impl AbRun {
    pub fn gate_failed(&self) -> bool {
        self.gate.as_ref().is_some_and(|g| !g.passed)
    }
}

/// Resolves one arm to what serves it.
fn resolve_arm(
    role: &str,
    spec: &str,
    cfg: &AbConfig,
    common: &[String],
    progress: &mut dyn FnMut(&str),
) -> Result<ArmInfo, AbError> {
    let parsed = parse_arm(spec, &cfg.variants)?;
    let (bin, profile, build) = match &parsed {
        ArmSpec::Profile { name, .. } => (cfg.worker_bin.clone(), Some(name.clone()), None),
        ArmSpec::ProfileFile(p) => (
            cfg.worker_bin.clone(),
            Some(
                std::fs::canonicalize(p)
                    .unwrap_or_else(|_| p.clone())
                    .display()
                    .to_string(),
            ),
            None,
        ),
        ArmSpec::Binary(p) => (
            std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()),
            None,
            None,
        ),
        ArmSpec::Git(r) => {
            let b = build::build(&cfg.root, r, &cfg.scratch, &mut *progress)?;
            (b.bin.clone(), None, Some(b))
        }
    };
    Ok(ArmInfo {
        role: role.to_string(),
        spec: spec.to_string(),
        args: worker_args(common, profile.as_deref()),
        bin,
        build,
        ready: Ready::default(),
    })
}

/// The options both workers get. `-p`/`-n`/`-d` size the worker's
/// context: the longest of the timed test and the gate's prompts.
fn common_args(cfg: &AbConfig) -> Vec<String> {
    let longest_gate = cfg
        .gate
        .as_ref()
        .and_then(|g| g.lengths.iter().copied().max())
        .unwrap_or(0);
    let mut v = vec![
        "-p".to_string(),
        cfg.n_prompt
            .max(longest_gate.saturating_sub(cfg.depth))
            .to_string(),
        "-n".to_string(),
        cfg.n_gen.to_string(),
        "-d".to_string(),
        cfg.depth.to_string(),
    ];
    if let Some(m) = &cfg.model {
        v.push("-m".into());
        v.push(m.display().to_string());
    }
    if let Some(b) = &cfg.backend {
        v.push("--backend".into());
        v.push(b.clone());
    }
    if let Some(u) = cfg.ubatch {
        v.push("--ubatch".into());
        v.push(u.to_string());
    }
    if let Some(k) = &cfg.kv_type {
        v.push("--kv-type".into());
        v.push(k.clone());
    }
    v
}

/// One request's samples.
struct Rep {
    arm: usize,
    seq: usize,
    block: Option<usize>,
    reply: BenchReply,
}

/// Runs the A/B; `progress` gets one line per step.
pub fn run(cfg: &AbConfig, mut progress: impl FnMut(&str)) -> Result<AbRun, AbError> {
    if cfg.reps < 2 * verdict::MIN_BLOCKS || cfg.reps % 2 != 0 {
        return Err(AbError::BadInput {
            msg: format!(
                "--reps {}: an even number of at least {} is needed (ABBA blocks hold two reps of each arm; at least {} blocks)",
                cfg.reps,
                2 * verdict::MIN_BLOCKS,
                verdict::MIN_BLOCKS
            ),
        });
    }
    if cfg.n_prompt == 0 {
        return Err(AbError::BadInput {
            msg: "-p 0: every rep times a prefill of at least one token".into(),
        });
    }
    std::fs::create_dir_all(&cfg.out).map_err(|e| AbError::Io {
        path: cfg.out.clone(),
        msg: format!("cannot create: {e}"),
    })?;
    let common = common_args(cfg);
    let mut arms = [
        resolve_arm("baseline", &cfg.baseline, cfg, &common, &mut progress)?,
        resolve_arm("candidate", &cfg.candidate, cfg, &common, &mut progress)?,
    ];
    // Both load side by side.
    let spec_of = |a: &ArmInfo| WorkerSpec {
        arm: a.role.clone(),
        bin: a.bin.clone(),
        args: a.args.clone(),
        cwd: cfg.root.clone(),
        log: Some(cfg.out.join(format!("worker-{}.log", a.role))),
        echo: cfg.echo,
    };
    let mut workers: Vec<Worker> = Vec::new();
    for a in &arms {
        progress(&format!(
            "{}: starting {} {}",
            a.role,
            a.bin.display(),
            a.args.join(" ")
        ));
        workers.push(Worker::start(&spec_of(a), cfg.timeout)?);
    }
    for (w, a) in workers.iter_mut().zip(arms.iter_mut()) {
        a.ready = w.wait_ready()?.clone();
        progress(&format!(
            "{} ready: {} {} on {} ({}), profile '{}', git {}",
            a.role,
            a.ready.model.name,
            a.ready.model.wtype,
            a.ready.backend,
            a.ready.gpu.name,
            a.ready.profile,
            if a.ready.git.is_empty() {
                "?"
            } else {
                &a.ready.git
            }
        ));
    }
    let mut notes = Vec::new();
    let (ma, mb) = (&arms[0].ready.model, &arms[1].ready.model);
    if (&ma.name, &ma.wtype, ma.bytes) != (&mb.name, &mb.wtype, mb.bytes) {
        return Err(AbError::BadInput {
            msg: format!(
                "the arms loaded different models: baseline {} {} ({} B, {}), candidate {} {} ({} B, {}); pass -m to give both the same file",
                ma.name, ma.wtype, ma.bytes, ma.path, mb.name, mb.wtype, mb.bytes, mb.path
            ),
        });
    }
    if arms[0].ready.backend != arms[1].ready.backend {
        notes.push(format!(
            "the arms run on different backends: {} and {}",
            arms[0].ready.backend, arms[1].ready.backend
        ));
    }
    if arms[0].ready.gpu.name != arms[1].ready.gpu.name {
        notes.push(format!(
            "the arms report different devices: {} and {}",
            arms[0].ready.gpu.name, arms[1].ready.gpu.name
        ));
    }

    // 1. Numerics gate.
    let mut gate_result = None;
    if let Some(g) = &cfg.gate {
        let tmp = cfg.out.join("gate-tmp");
        let (wa, wb) = workers.split_at_mut(1);
        let cap = arms
            .iter()
            .map(|a| a.ready.ctx)
            .filter(|&c| c > 0)
            .min()
            .unwrap_or(usize::MAX);
        let mut g = g.clone();
        if g.lengths.iter().any(|&n| n > cap) {
            notes.push(format!(
                "numerics gate prompts clipped to the workers' context of {cap} positions"
            ));
            g.lengths = g.lengths.iter().map(|&n| n.min(cap)).collect();
        }
        let tracked = crate::interrupt::track_temp(tmp.clone());
        let r = gate::run(&mut wa[0], &mut wb[0], &g, &tmp, &mut progress);
        let _ = std::fs::remove_dir_all(&tmp);
        drop(tracked);
        let r = r?;
        progress(&format!("numerics gate {}", r.message));
        let failed = !r.passed;
        gate_result = Some(r);
        if failed {
            for w in workers {
                let _ = w.quit();
            }
            return Ok(AbRun {
                arms,
                gate: gate_result,
                tests: Vec::new(),
                rows: Vec::new(),
                notes,
            });
        }
    } else {
        notes.push("numerics gate skipped (--no-gate)".into());
    }

    // 2. Timing: warm-ups, then ABBA blocks.
    let mut order: Vec<(usize, Option<usize>)> = Vec::new();
    for w in 0..cfg.warmup {
        if w % 2 == 0 {
            order.extend([(0, None), (1, None)]);
        } else {
            order.extend([(1, None), (0, None)]);
        }
    }
    for b in 0..cfg.reps / 2 {
        order.extend([(0, Some(b)), (1, Some(b)), (1, Some(b)), (0, Some(b))]);
    }
    let req = bench_request(cfg.n_prompt, cfg.n_gen, cfg.depth, false);
    let mut reps: Vec<Rep> = Vec::new();
    let mut restarts = 0;
    for (seq, &(arm, block)) in order.iter().enumerate() {
        // Fresh processes for every block after the first: each process's
        // device-memory placement otherwise biases its arm for the whole
        // run (about 0.5-1 % of decode on an H100), which no amount of
        // interleaving removes; restarted per block, it becomes noise
        // between blocks that the interval measures.
        let starts_block = block.is_some_and(|b| b > 0) && seq > 0 && order[seq - 1].1 != block;
        if cfg.respawn && starts_block {
            for w in workers.drain(..) {
                w.quit()?;
            }
            for a in &arms {
                workers.push(Worker::start(&spec_of(a), cfg.timeout)?);
            }
            for w in workers.iter_mut() {
                w.wait_ready()?;
            }
            // The first request of a process captures its decode graph
            // and warms its caches: discarded.
            for w in workers.iter_mut() {
                w.request::<BenchReply>(&req)?;
            }
            restarts += 1;
            progress(&format!(
                "block {}: workers restarted",
                block.map_or(0, |b| b + 1)
            ));
        }
        let reply: BenchReply = workers[arm].request(&req)?;
        if !(reply.pp_tps.is_finite() && reply.pp_tps > 0.0)
            || (cfg.n_gen > 0 && !(reply.tg_tps.is_finite() && reply.tg_tps > 0.0))
        {
            return Err(workers[arm].error(format!(
                "bench reply without a positive speed: pp_tps {}, tg_tps {}",
                reply.pp_tps, reply.tg_tps
            )));
        }
        progress(&format!(
            "{:>3}/{} {} {:<9} pp {:.1} t/s{}{}",
            seq + 1,
            order.len(),
            if block.is_some() { "rep   " } else { "warmup" },
            arms[arm].role,
            reply.pp_tps,
            if cfg.n_gen > 0 {
                format!(", tg {:.2} t/s", reply.tg_tps)
            } else {
                String::new()
            },
            reply
                .clocks
                .as_ref()
                .filter(|c| !c.throttle.is_empty())
                .map(|c| format!(" [{}]", c.throttle))
                .unwrap_or_default()
        ));
        reps.push(Rep {
            arm,
            seq,
            block,
            reply,
        });
    }
    if restarts > 0 {
        notes.push(format!(
            "--respawn: both workers restarted before each of the {restarts} blocks after the first, one discarded request each"
        ));
    }
    // Attribution: ABBA blocks of phase-timed requests.
    let phase_req = bench_request(cfg.n_prompt, cfg.n_gen, cfg.depth, true);
    let mut phase_reps: Vec<Rep> = Vec::new();
    for b in 0..cfg.phase_blocks {
        for arm in [0, 1, 1, 0] {
            let reply: BenchReply = workers[arm].request(&phase_req)?;
            progress(&format!(
                "phases {}/{} {:<9} pp {:.1} t/s",
                b + 1,
                cfg.phase_blocks,
                arms[arm].role,
                reply.pp_tps
            ));
            phase_reps.push(Rep {
                arm,
                seq: order.len() + phase_reps.len(),
                block: Some(b),
                reply,
            });
        }
    }
    for w in workers {
        if let Err(e) = w.quit() {
            notes.push(format!("{e}"));
        }
    }
    if cfg.phase_blocks > 0
        && phase_reps
            .iter()
            .all(|r| r.reply.phases.prefill.is_empty() && r.reply.phases.decode.is_empty())
    {
        notes.push("the workers sent no phase times; no attribution".into());
    }

    // 3. Throttle flags over the measured reps of both arms.
    let measured: Vec<&Rep> = reps.iter().filter(|r| r.block.is_some()).collect();
    let reasons: Vec<String> = measured
        .iter()
        .map(|r| {
            r.reply
                .clocks
                .as_ref()
                .map(|c| c.throttle.clone())
                .unwrap_or_default()
        })
        .collect();
    let means: Vec<Option<f64>> = measured
        .iter()
        .map(|r| r.reply.clocks.as_ref().and_then(|c| c.sm_mhz_mean))
        .collect();
    let flags = verdict::throttle_flags(
        &reasons.iter().map(String::as_str).collect::<Vec<_>>(),
        &means,
    );
    let flag_of: BTreeMap<usize, String> = measured
        .iter()
        .zip(flags)
        .map(|(r, f)| (r.seq, f))
        .collect();

    // 4. Judge each test.
    let mut tests = Vec::new();
    let kinds: Vec<(&'static str, String)> = {
        let mut v = vec![("prefill", test_name("pp", cfg.n_prompt, cfg.depth))];
        if cfg.n_gen > 0 {
            v.push(("decode", test_name("tg", cfg.n_gen, cfg.depth)));
        }
        v
    };
    let sample = |r: &Rep, phase: &str| -> RepSample {
        let (tps, ms, phases) = if phase == "prefill" {
            let ms = if r.reply.pp_ms > 0.0 {
                r.reply.pp_ms
            } else {
                1000.0 * cfg.n_prompt as f64 / r.reply.pp_tps
            };
            (r.reply.pp_tps, ms, r.reply.phases.prefill.clone())
        } else {
            let ms = if r.reply.tg_ms > 0.0 {
                r.reply.tg_ms / cfg.n_gen.max(1) as f64
            } else {
                1000.0 / r.reply.tg_tps
            };
            (r.reply.tg_tps, ms, r.reply.phases.decode.clone())
        };
        RepSample {
            seq: r.seq,
            tps,
            ms,
            phases,
            throttle: flag_of.get(&r.seq).cloned().unwrap_or_default(),
        }
    };
    let blocks_of = |reps: &[&Rep], n: usize, phase: &str| -> Vec<Block> {
        let mut blocks = Vec::new();
        for b in 0..n {
            let of = |arm: usize| -> Vec<&Rep> {
                reps.iter()
                    .copied()
                    .filter(|r| r.block == Some(b) && r.arm == arm)
                    .collect()
            };
            let (a, c) = (of(0), of(1));
            if a.len() == 2 && c.len() == 2 {
                blocks.push(Block {
                    a: [sample(a[0], phase), sample(a[1], phase)],
                    b: [sample(c[0], phase), sample(c[1], phase)],
                });
            }
        }
        blocks
    };
    let phase_measured: Vec<&Rep> = phase_reps.iter().collect();
    let mut used_blocks: BTreeMap<&'static str, Vec<bool>> = BTreeMap::new();
    for (phase, test) in &kinds {
        let blocks = blocks_of(&measured, cfg.reps / 2, phase);
        let judgement = verdict::judge(&blocks, &cfg.verdict);
        // Phase times come from their own requests when there are any;
        // a worker may also send them with every timed reply.
        let attribution = if phase_measured.is_empty() {
            verdict::attribute(&blocks, &cfg.verdict)
        } else {
            verdict::attribute(
                &blocks_of(&phase_measured, cfg.phase_blocks, phase),
                &cfg.verdict,
            )
        };
        used_blocks.insert(phase, verdict::used_blocks(&blocks, &cfg.verdict));
        tests.push(TestResult {
            test: test.clone(),
            phase,
            judgement,
            attribution,
        });
    }

    // 5. Rows: one per request and test.
    let mut rows = Vec::new();
    for r in &reps {
        let a = &arms[r.arm];
        for (phase, test) in &kinds {
            let s = sample(r, phase);
            let used = r.block.is_some_and(|b| {
                used_blocks
                    .get(phase)
                    .and_then(|u| u.get(b))
                    .copied()
                    .unwrap_or(false)
            });
            let c = r.reply.clocks.clone().unwrap_or_default();
            rows.push(AbRow {
                schema_version: AB_SCHEMA_VERSION,
                kind: KIND_AB.to_string(),
                arm: a.role.clone(),
                spec: a.spec.clone(),
                profile: a.ready.profile.clone(),
                git: a.ready.git.clone(),
                model: a.ready.model.name.clone(),
                wtype: a.ready.model.wtype.clone(),
                backend: a.ready.backend.clone(),
                gpu: a.ready.gpu.name.clone(),
                test: test.clone(),
                n_prompt: cfg.n_prompt,
                n_gen: cfg.n_gen,
                depth: cfg.depth,
                seq: r.seq,
                block: r.block,
                warmup: r.block.is_none(),
                tps: s.tps,
                ms: s.ms,
                used,
                throttle: s.throttle.clone(),
                sm_mhz_min: c.sm_mhz_min,
                sm_mhz_mean: c.sm_mhz_mean,
                mem_mhz: c.mem_mhz,
                temp_c_max: c.temp_c_max,
                power_w_mean: c.power_w_mean,
                clock_reasons: c.throttle.clone(),
                phases: join_phases(&s.phases),
            });
        }
    }
    if arms[0].spec == arms[1].spec {
        notes.push("A/A run: both arms are the same; the verdict should be SAME".into());
    }
    Ok(AbRun {
        arms,
        gate: gate_result,
        tests,
        rows,
        notes,
    })
}

/// Slots whose variant differs between the arms ("slot: a -> b").
pub fn changed_slots(a: &Ready, b: &Ready) -> Vec<(String, String, String)> {
    let keys: std::collections::BTreeSet<&String> = a.slots.keys().chain(b.slots.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (a.slots.get(k), b.slots.get(k));
            (x != y).then(|| {
                (
                    k.clone(),
                    x.cloned().unwrap_or_else(|| "-".into()),
                    y.cloned().unwrap_or_else(|| "-".into()),
                )
            })
        })
        .collect()
}

/// A name's tokens for phase/slot matching; `gemv` reads as `gemm`
/// because the engine names its matmul phases `gemm_*` in both passes.
fn tokens(s: &str) -> Vec<&str> {
    s.split(['_', '/', '-', '.'])
        .filter(|t| !t.is_empty() && *t != "prefill" && *t != "decode")
        .map(|t| if t == "gemv" { "gemm" } else { t })
        .collect()
}

/// The slots a phase's time belongs to, by name: every remaining token of
/// the slot's name (split on `_`, with `prefill`/`decode` dropped) appears
/// in the phase's name or the other way round, and the slot is not
/// specific to the other test (`attn_prefill_swa` matches phase `attn_swa`
/// of the prefill, not of the decode).
pub fn slots_of_phase<'a>(phase: &str, test: &str, slots: &'a [String]) -> Vec<&'a String> {
    let pt = tokens(phase);
    if pt.is_empty() {
        return Vec::new();
    }
    let other = if test == "prefill" {
        "decode"
    } else {
        "prefill"
    };
    slots
        .iter()
        .filter(|s| !s.split('_').any(|t| t == other))
        .filter(|s| {
            let st = tokens(s);
            !st.is_empty()
                && (st.iter().all(|t| pt.contains(t)) || pt.iter().all(|t| st.contains(t)))
        })
        .collect()
}

/// Where the run's default output goes.
pub fn default_out(scratch: &Path) -> PathBuf {
    scratch.join(format!("ab-{}", crate::util::timestamp()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_map_to_slots_by_name() {
        let slots: Vec<String> = [
            "attn_prefill_swa",
            "attn_decode",
            "prefill_gemm",
            "decode_gemv",
            "norm",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let names = |phase: &str, test: &str| -> Vec<String> {
            slots_of_phase(phase, test, &slots)
                .into_iter()
                .cloned()
                .collect()
        };
        assert_eq!(names("attn_swa", "prefill"), ["attn_prefill_swa"]);
        // The decode attention slot serves both kinds of layer.
        assert_eq!(names("attn_swa", "decode"), ["attn_decode"]);
        assert_eq!(names("gemm_ffn_up", "prefill"), ["prefill_gemm"]);
        assert_eq!(names("attn", "decode"), ["attn_decode"]);
        assert!(names("head", "prefill").is_empty());
        assert_eq!(names("norm_rope", "decode"), ["norm"]);
    }

    #[test]
    fn changed_slots_lists_differences_both_ways() {
        let mut a = Ready::default();
        let mut b = Ready::default();
        a.slots.insert("x".into(), "f/v1".into());
        b.slots.insert("x".into(), "f/v2".into());
        a.slots.insert("same".into(), "f/v".into());
        b.slots.insert("same".into(), "f/v".into());
        b.slots.insert("new".into(), "g/w".into());
        assert_eq!(
            changed_slots(&a, &b),
            vec![
                ("new".to_string(), "-".to_string(), "g/w".to_string()),
                ("x".to_string(), "f/v1".to_string(), "f/v2".to_string()),
            ]
        );
    }
}

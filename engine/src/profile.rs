//! Engine kernel profiles (`variants/profiles/*.toml`): which family variant
//! serves each engine slot.
//!
//! ```toml
//! name = "main"
//! description = "the best checked kernels for the device"
//!
//! [slot.gemm]                      # every prefill GEMM slot
//! family = "gemm_wgmma"
//! defines = { DQ_TYPE = "F16", BM = 128, WG = 2, MW = 1, STAGES = 4, KSPLIT = 1 }
//! tuned = true                     # refine from variants/tuned/sm_XX.toml
//! fallback = "gemm_dq_f16"         # a [fallback.NAME] for devices that cannot run it
//!
//! [slot."gemm.down"]               # one projection kind overrides its group
//! family = "gemm_wgmma"
//! defines = { ..., KSPLIT = 2 }
//!
//! [fallback.gemm_dq_f16]
//! family = "gemm_dq"
//! defines = { DQ_TYPE = "F16", BM = 128, BN = 128, ... }
//! fallback = "NEXT"                # optional: tried where this one cannot run either
//! ```
//!
//! A slot is looked up by its full name (`gemm.down`), then by its group
//! (`gemm`); a `@TYPE` suffix (`gemv@Q4_0`) restricts an entry to matmuls
//! whose weights have that type, and wins over the plain name. A profile
//! with a `base` takes the base's entries, except those its own entries
//! cover: an entry replaces every base entry it generalizes (`gemv`
//! replaces the base's `gemv@Q4_0`, `gemv.head` and `gemv.head@Q6_K`;
//! `gemv@Q8_0` replaces `gemv.o@Q8_0`), so writing `[slot.gemv]` in a
//! derived profile sets every GEMV the profile does not name more
//! narrowly itself, whatever the base specializes. Defines bound to the
//! call site (`WTYPE`, `KV_TYPE`, the output format `OUT`) are never
//! written in a profile: the engine sets them.
//! Profiles are data: the engine embeds the committed ones and reads any
//! other from a path. Reading one checks what needs no model or device
//! (slot names, registered families, declared and unbound defines,
//! fallback chains), every error naming `FILE:LINE`; the engine validates
//! each choice against its family and the device when it plans a model.

use crate::cuda::slots::Slot;
use gemtune_kernels::defines::{DefineValue, Defines};
use gemtune_kernels::quant::GgmlType;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use toml::de::{DeTable, DeValue};

/// A profile as written in its file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Profile this one starts from (its slots are copied, then overridden).
    #[serde(default)]
    pub base: Option<String>,
    /// K/V cache type this profile asks for (`--kv-type` overrides it).
    #[serde(default)]
    pub kv_type: Option<String>,
    /// Weights are never converted lossily at load: a model with a matrix
    /// no kernel reads in its own type is refused (`strict`). Inherited
    /// from the base unless set.
    #[serde(default)]
    pub lossless: Option<bool>,
    /// How a tied head stored as Q6_K is read when `gemv.head` reads
    /// planes: `"Q8_0"` (a lossy conversion at load that this profile asks
    /// for; `run`/`bench` print it) or `"none"` (the file's own Q6_K, as a
    /// lossless plane repack). Inherited from the base unless set.
    #[serde(default)]
    pub head_convert: Option<String>,
    /// Where the prefill GEMMs find a quantized matrix's scales:
    /// `"resident"` (a second scale plane per matrix, uploaded at load) or
    /// `"expand"` (the `scale_expand` slot writes it from the decode GEMV's
    /// plane into a scratch buffer before each GEMM, so the device holds
    /// the file's bytes). Inherited from the base unless set.
    #[serde(default)]
    pub gemm_scales: Option<String>,
    /// How a decode step's kernels follow each other on the GPU:
    /// `"chained"` (each launch a programmatic dependent of the one before:
    /// its blocks become resident while that grid runs and wait for it on
    /// the device, so the launch latency and the grid's ramp overlap the
    /// previous kernel), `"chained-dense"` (chained on a dense model, in
    /// stream order on a mixture-of-experts model, where chaining measured
    /// slower) or `"plain"` (stream order). The same kernels and arithmetic
    /// either way. Inherited from the base unless set.
    #[serde(default)]
    pub decode_launch: Option<String>,
    /// How a decode step computes `gelu(PLE gate) * per-layer input`
    /// (E2B/E4B): `"fused"` (the gate GEMV multiplies its own outputs, gemv
    /// FUSE=2, where the gate's variant is a plain GEMV and the projection
    /// after it reads f32: one launch fewer per layer) or `"separate"` (a
    /// `gelu_mul` launch after the gate). The same arithmetic either way.
    /// Inherited from the base unless set.
    #[serde(default)]
    pub ple_gelu: Option<String>,
    /// How a dense decode step runs the sandwich norms after the output,
    /// down and PLE projections: `"fused"` (in the tail of the projection's
    /// GEMV, gemv TAIL=1, where its variant takes it: the residual add and
    /// the next projection's input norm by the grid's last block, no norm
    /// launch) or `"separate"` (an `rmsnorm` launch after the projection).
    /// The same formulas; the sums of squares are added in another order.
    /// Inherited from the base unless set.
    #[serde(default)]
    pub norm_tail: Option<String>,
    /// Where a mixture-of-experts layer launches its router: `"late"`
    /// (after the shared MLP, just before the expert GEMVs) or `"early"`
    /// (right after the attention residual, before the shared MLP: both
    /// read only the FFN block's input, so the logits are the same). Early,
    /// a grid stands between the router and the expert gate|up, which may
    /// then read the router's ids before its chained launch's wait
    /// (moe_gemv PRELOAD=2). Inherited from the base unless set.
    #[serde(default)]
    pub moe_route: Option<String>,
    #[serde(default)]
    pub slot: BTreeMap<String, SlotChoice>,
    #[serde(default)]
    pub fallback: BTreeMap<String, Choice>,
}

/// A family and its defines (a `[fallback.NAME]` table).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Choice {
    pub family: String,
    #[serde(default)]
    pub defines: BTreeMap<String, DefineValue>,
    /// The next `[fallback.NAME]` to try where this one cannot run either
    /// (a chain: a Hopper kernel for small GQA groups, then one for larger
    /// groups, then one for every device).
    #[serde(default)]
    pub fallback: Option<String>,
}

/// What serves a slot.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SlotChoice {
    pub family: String,
    #[serde(default)]
    pub defines: BTreeMap<String, DefineValue>,
    /// Refine the defines from the device's tuned table where it has an
    /// entry for the slot's family at the call's shape.
    #[serde(default)]
    pub tuned: bool,
    /// Name of the first `[fallback.NAME]` of the chain used where this
    /// choice cannot run (a Hopper-only family on sm_80/sm_89, a tile
    /// whose rows do not hold the problem's GQA group).
    #[serde(default)]
    pub fallback: Option<String>,
    /// Why this choice (printed by `run -v`).
    #[serde(default)]
    pub why: Option<String>,
}

/// How the launches of a captured decode step follow each other
/// (`docs/architecture.md`, "Chained launches").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeLaunch {
    /// Stream order.
    Plain,
    /// Every launch after the step's first is a programmatic dependent of
    /// the one before.
    Chained,
    /// Chained on a dense model; stream order on a mixture-of-experts model
    /// (26B-A4B), whose decode measured slower chained.
    ChainedDense,
}

impl DecodeLaunch {
    /// The profile spelling (`decode_launch = "..."`).
    pub fn name(self) -> &'static str {
        match self {
            DecodeLaunch::Plain => "plain",
            DecodeLaunch::Chained => "chained",
            DecodeLaunch::ChainedDense => "chained-dense",
        }
    }
    fn parse(s: &str) -> Option<DecodeLaunch> {
        [
            DecodeLaunch::Plain,
            DecodeLaunch::Chained,
            DecodeLaunch::ChainedDense,
        ]
        .into_iter()
        .find(|d| d.name() == s)
    }
}

/// A resolved profile: every slot's choice, with bases applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// Where it came from (`builtin:main` or a path).
    pub source: String,
    pub kv_type: Option<String>,
    /// Refuse models whose weights the engine would convert lossily.
    pub lossless: bool,
    /// The type a Q6_K tied head read through planes is converted to at
    /// load (`ProfileFile::head_convert`); `None`: read as it is.
    pub head_convert: Option<GgmlType>,
    /// The prefill GEMMs' scale plane is expanded per launch from the
    /// GEMV's (`ProfileFile::gemm_scales = "expand"`).
    pub expand_gemm_scales: bool,
    /// How a decode step's launches follow each other
    /// (`ProfileFile::decode_launch`).
    pub decode_launch: DecodeLaunch,
    /// The PLE gate GEMV writes `gelu(gate) * per-layer input` itself in
    /// decode (`ProfileFile::ple_gelu = "fused"`).
    pub fuse_ple_gelu: bool,
    /// Decode projections run the norm after them in their GEMV's tail
    /// (`ProfileFile::norm_tail = "fused"`).
    pub fuse_norm_tail: bool,
    /// A MoE layer launches its router before the shared MLP
    /// (`ProfileFile::moe_route = "early"`).
    pub moe_route_early: bool,
    pub slots: BTreeMap<String, SlotChoice>,
    pub fallbacks: BTreeMap<String, Choice>,
    /// Where each slot entry was written, `FILE:LINE` (an entry inherited
    /// from the base keeps the base's), for messages about its choice.
    pub origins: BTreeMap<String, String>,
}

/// A profile that cannot be used. `at` is `FILE:LINE` of the offending
/// key (`FILE:LINE:COL` for a syntax error), or the profile's source
/// where no single key is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{at}: {msg}")]
    Parse { at: String, msg: String },
    #[error("unknown profile '{name}': the committed profiles are {known}; or pass a path to a .toml file")]
    Unknown { name: String, known: String },
    #[error("{at}: slot '{slot}' is not an engine slot (slots: {known})")]
    UnknownSlot {
        at: String,
        slot: String,
        known: String,
    },
    #[error(
        "{at}: {owner} names family '{family}', which is not a kernel family (families: {known})"
    )]
    UnknownFamily {
        at: String,
        owner: String,
        family: String,
        known: String,
    },
    #[error("{at}: {owner} sets {define}, which {family} does not declare (its defines: {known})")]
    UndeclaredDefine {
        at: String,
        owner: String,
        family: String,
        define: String,
        known: String,
    },
    #[error(
        "{at}: slot '{slot}' names fallback '{fallback}', which has no [fallback.{fallback}] table"
    )]
    MissingFallback {
        at: String,
        slot: String,
        fallback: String,
    },
    #[error("{at}: the fallback chain from slot '{slot}' comes back to '{fallback}'")]
    FallbackCycle {
        at: String,
        slot: String,
        fallback: String,
    },
    #[error("{at}: {owner} sets {define}, which the engine binds at each call site")]
    BoundDefine {
        at: String,
        owner: String,
        define: String,
    },
    #[error(
        "{at}: profile {profile} has no choice for slot '{slot}' (nor for its group '{group}')"
    )]
    Unserved {
        at: String,
        profile: String,
        slot: String,
        group: String,
    },
    #[error("{path}: cannot read: {err}")]
    Io { path: String, err: String },
}

/// The families a profile may name besides the kernel families: the
/// vendor GEMM arm, which takes no defines.
pub const VENDOR_FAMILIES: &[&str] = &[crate::cuda::planner::VENDOR_BF16];

/// Finds keys of a profile's text, for `FILE:LINE` in messages.
struct Locator<'t> {
    source: &'t str,
    text: &'t str,
    doc: Option<toml::Spanned<DeTable<'t>>>,
}

impl<'t> Locator<'t> {
    fn new(source: &'t str, text: &'t str) -> Locator<'t> {
        Locator {
            source,
            text,
            doc: DeTable::parse(text).ok(),
        }
    }

    /// `SOURCE:LINE:COL` of a byte offset.
    fn offset(&self, at: usize) -> String {
        let before = self.text.get(..at).unwrap_or(self.text);
        let line = before.matches('\n').count() + 1;
        let col = before
            .rfind('\n')
            .map_or(before.len(), |p| before.len() - p - 1)
            + 1;
        format!("{}:{line}:{col}", self.source)
    }

    /// `SOURCE:LINE` of the deepest key of `path` (e.g. `slot`, `gemv`,
    /// `defines`, `ALGO`) that the text has; `SOURCE` when not even the
    /// first is there.
    fn key(&self, path: &[&str]) -> String {
        let mut found = None;
        let mut table = self.doc.as_ref().map(|d| d.get_ref());
        for k in path {
            let Some((key, value)) = table.and_then(|t| t.get_key_value(*k)) else {
                break;
            };
            found = Some(key.span().start);
            table = match value.get_ref() {
                DeValue::Table(t) => Some(t),
                _ => None,
            };
        }
        match found {
            Some(at) => {
                let at = self.offset(at);
                at.rsplit_once(':')
                    .map_or(at.clone(), |(l, _)| l.to_string())
            }
            None => self.source.to_string(),
        }
    }
}

/// Checks a choice's family and defines: a registered family (or the
/// vendor arm, without defines), every define declared by its source and
/// none of those the engine binds. `table` is `slot` or `fallback`.
fn check_choice(
    loc: &Locator<'_>,
    table: &str,
    name: &str,
    family: &str,
    defines: &BTreeMap<String, DefineValue>,
) -> Result<(), ProfileError> {
    let owner = match table {
        "slot" => format!("slot '{name}'"),
        _ => format!("[fallback.{name}]"),
    };
    if let Some(d) = defines.keys().find(|d| BOUND_DEFINES.contains(&d.as_str())) {
        return Err(ProfileError::BoundDefine {
            at: loc.key(&[table, name, "defines", d]),
            owner,
            define: d.clone(),
        });
    }
    let Some(fam) = gemtune_kernels::family::family(family) else {
        if VENDOR_FAMILIES.contains(&family) {
            if let Some(d) = defines.keys().next() {
                return Err(ProfileError::UndeclaredDefine {
                    at: loc.key(&[table, name, "defines", d]),
                    owner,
                    family: family.to_string(),
                    define: d.clone(),
                    known: "none".into(),
                });
            }
            return Ok(());
        }
        let known: Vec<&str> = gemtune_kernels::family::families()
            .iter()
            .map(|f| f.name())
            .chain(VENDOR_FAMILIES.iter().copied())
            .collect();
        return Err(ProfileError::UnknownFamily {
            at: loc.key(&[table, name, "family"]),
            owner,
            family: family.to_string(),
            known: known.join(", "),
        });
    };
    let declared = fam.declared_defines();
    if let Some(d) = defines.keys().find(|d| !declared.contains(d)) {
        return Err(ProfileError::UndeclaredDefine {
            at: loc.key(&[table, name, "defines", d]),
            owner,
            family: format!("{} ({})", fam.name(), fam.source_file()),
            define: d.clone(),
            known: declared.join(", "),
        });
    }
    Ok(())
}

/// A `"fused" | "separate"` key: sets `fused` when the key is given
/// (otherwise the base's value stands), refuses any other value.
fn fused_or_separate(
    loc: &Locator,
    key: &str,
    value: Option<&str>,
    fused: &mut bool,
) -> Result<(), ProfileError> {
    either(loc, key, value, ("fused", "separate"), fused)
}

/// A key of two spellings: `on` sets `flag`, `off` clears it, absent keeps
/// the base's; anything else is an error naming both.
fn either(
    loc: &Locator,
    key: &str,
    value: Option<&str>,
    (on, off): (&str, &str),
    flag: &mut bool,
) -> Result<(), ProfileError> {
    match value {
        None => {}
        Some(v) if v == on => *flag = true,
        Some(v) if v == off => *flag = false,
        Some(other) => {
            return Err(ProfileError::Parse {
                at: loc.key(&[key]),
                msg: format!("{key} = \"{other}\": write \"{on}\" or \"{off}\""),
            })
        }
    }
    Ok(())
}

/// Defines the engine sets per call site; a profile must not. (`H_RECORDS`:
/// the MoE gate|up writes h in the format its down stage reads;
/// `TAIL`, `TAIL_OUT`: a decode GEMV runs the norm after it where the
/// profile's `norm_tail` says so, in the format the next projection reads.)
pub const BOUND_DEFINES: &[&str] = &[
    "WTYPE",
    "KV_TYPE",
    "HEAD_DIM",
    "OUT",
    "H_RECORDS",
    "TAIL",
    "TAIL_OUT",
];

/// The committed profiles, embedded so the binary works anywhere.
pub const BUILTIN: &[(&str, &str)] = &[
    ("main", include_str!("../../variants/profiles/main.toml")),
    (
        "flash-swa",
        include_str!("../../variants/profiles/flash-swa.toml"),
    ),
    (
        "attn-mma",
        include_str!("../../variants/profiles/attn-mma.toml"),
    ),
    (
        "decode-km",
        include_str!("../../variants/profiles/decode-km.toml"),
    ),
    (
        "strict",
        include_str!("../../variants/profiles/strict.toml"),
    ),
    (
        "cublas",
        include_str!("../../variants/profiles/cublas.toml"),
    ),
    (
        "mma-sync",
        include_str!("../../variants/profiles/mma-sync.toml"),
    ),
    ("dp4a", include_str!("../../variants/profiles/dp4a.toml")),
    (
        "norm-tail",
        include_str!("../../variants/profiles/norm-tail.toml"),
    ),
    ("mmq", include_str!("../../variants/profiles/mmq.toml")),
    (
        "resident-scales",
        include_str!("../../variants/profiles/resident-scales.toml"),
    ),
    (
        "q6k-head",
        include_str!("../../variants/profiles/q6k-head.toml"),
    ),
    (
        "q8-head",
        include_str!("../../variants/profiles/q8-head.toml"),
    ),
    (
        "kq-split",
        include_str!("../../variants/profiles/kq-split.toml"),
    ),
    (
        "q8-fma",
        include_str!("../../variants/profiles/q8-fma.toml"),
    ),
    (
        "q8-fused",
        include_str!("../../variants/profiles/q8-fused.toml"),
    ),
];

fn slot_group(slot: &str) -> &str {
    slot.split('.').next().unwrap_or(slot)
}

/// Whether entry key `general` covers the strictly narrower key `narrow`:
/// the same slot or a slot of the same group (`gemv` covers `gemv.head`),
/// and the same weight type or none (`gemv` covers `gemv@Q4_0`,
/// `gemv@Q8_0` covers `gemv.o@Q8_0`, `gemv@Q8_0` does not cover
/// `gemv.o@Q4_0`).
fn generalizes(general: &str, narrow: &str) -> bool {
    let split = |k: &str| -> (String, Option<String>) {
        match k.split_once('@') {
            Some((b, w)) => (b.to_string(), Some(w.to_ascii_uppercase())),
            None => (k.to_string(), None),
        }
    };
    let ((gb, gt), (nb, nt)) = (split(general), split(narrow));
    let slot_covered = nb == gb || (!gb.contains('.') && nb.starts_with(&format!("{gb}.")));
    let type_covered = gt.is_none() || gt == nt;
    general != narrow && slot_covered && type_covered
}

/// Whether `name` is a slot or a slot group, optionally restricted to a
/// weight type (`gemv@Q4_0`).
fn known_slot(name: &str) -> bool {
    let (base, wt) = match name.split_once('@') {
        Some((b, w)) => (b, Some(w)),
        None => (name, None),
    };
    if wt.is_some_and(|w| {
        gemtune_kernels::quant::GgmlType::from_name(&w.to_ascii_lowercase()).is_none()
    }) {
        return false;
    }
    Slot::served().any(|s| s.name() == base || s.group() == base)
}

impl Profile {
    /// A committed profile by name, or a profile file by path (a bare name
    /// is always a committed profile; anything with '/' or ".toml" a path).
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        if name_or_path.contains('/') || name_or_path.ends_with(".toml") {
            let p = Path::new(name_or_path);
            let text = std::fs::read_to_string(p).map_err(|e| ProfileError::Io {
                path: p.display().to_string(),
                err: e.to_string(),
            })?;
            return Profile::parse(&p.display().to_string(), &text);
        }
        let (_, text) = BUILTIN
            .iter()
            .find(|(n, _)| *n == name_or_path)
            .ok_or_else(|| ProfileError::Unknown {
                name: name_or_path.to_string(),
                known: BUILTIN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        Profile::parse(&format!("builtin:{name_or_path}"), text)
    }

    /// Parses a profile; `base` profiles are resolved among the committed ones.
    pub fn parse(source: &str, text: &str) -> Result<Profile, ProfileError> {
        let loc = Locator::new(source, text);
        let f: ProfileFile = toml::from_str(text).map_err(|e| ProfileError::Parse {
            at: e
                .span()
                .map_or_else(|| source.to_string(), |s| loc.offset(s.start)),
            msg: e.message().trim().to_string(),
        })?;
        let mut p = match &f.base {
            Some(b) if b == &f.name => {
                return Err(ProfileError::Parse {
                    at: loc.key(&["base"]),
                    msg: format!("profile '{b}' names itself as its base"),
                })
            }
            Some(b) => Profile::load(b)?,
            None => Profile {
                name: String::new(),
                description: String::new(),
                source: String::new(),
                kv_type: None,
                lossless: false,
                head_convert: None,
                expand_gemm_scales: false,
                decode_launch: DecodeLaunch::Plain,
                fuse_ple_gelu: false,
                fuse_norm_tail: false,
                moe_route_early: false,
                slots: BTreeMap::new(),
                fallbacks: BTreeMap::new(),
                origins: BTreeMap::new(),
            },
        };
        p.name = f.name.clone();
        p.description = f.description.clone();
        p.source = source.to_string();
        if f.kv_type.is_some() {
            p.kv_type = f.kv_type.clone();
        }
        if let Some(l) = f.lossless {
            p.lossless = l;
        }
        match f.head_convert.as_deref() {
            None => {}
            Some("none") => p.head_convert = None,
            Some("Q8_0") => p.head_convert = Some(GgmlType::Q8_0),
            Some(other) => {
                return Err(ProfileError::Parse {
                    at: loc.key(&["head_convert"]),
                    msg: format!("head_convert = \"{other}\": write \"Q8_0\" or \"none\""),
                })
            }
        }
        match f.gemm_scales.as_deref() {
            None => {}
            Some("resident") => p.expand_gemm_scales = false,
            Some("expand") => p.expand_gemm_scales = true,
            Some(other) => {
                return Err(ProfileError::Parse {
                    at: loc.key(&["gemm_scales"]),
                    msg: format!("gemm_scales = \"{other}\": write \"resident\" or \"expand\""),
                })
            }
        }
        if let Some(v) = f.decode_launch.as_deref() {
            p.decode_launch = DecodeLaunch::parse(v).ok_or_else(|| ProfileError::Parse {
                at: loc.key(&["decode_launch"]),
                msg: format!(
                    "decode_launch = \"{v}\": write \"chained\", \"chained-dense\" or \"plain\""
                ),
            })?;
        }
        fused_or_separate(
            &loc,
            "ple_gelu",
            f.ple_gelu.as_deref(),
            &mut p.fuse_ple_gelu,
        )?;
        fused_or_separate(
            &loc,
            "norm_tail",
            f.norm_tail.as_deref(),
            &mut p.fuse_norm_tail,
        )?;
        either(
            &loc,
            "moe_route",
            f.moe_route.as_deref(),
            ("early", "late"),
            &mut p.moe_route_early,
        )?;
        if p.lossless && p.head_convert.is_some() {
            return Err(ProfileError::Parse {
                at: loc.key(&["head_convert"]),
                msg: "a lossless profile cannot convert the head: set head_convert = \"none\""
                    .into(),
            });
        }
        for (k, v) in f.fallback {
            check_choice(&loc, "fallback", &k, &v.family, &v.defines)?;
            p.fallbacks.insert(k, v);
        }
        // The base's entries that this profile's entries generalize give
        // way before any of this profile's own entries go in.
        let covered: Vec<String> = p
            .slots
            .keys()
            .filter(|k| f.slot.keys().any(|own| generalizes(own, k)))
            .cloned()
            .collect();
        for k in covered {
            p.slots.remove(&k);
            p.origins.remove(&k);
        }
        for (slot, c) in f.slot {
            if !known_slot(&slot) {
                return Err(ProfileError::UnknownSlot {
                    at: loc.key(&["slot", &slot]),
                    slot,
                    known: Slot::served()
                        .map(|s| s.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            check_choice(&loc, "slot", &slot, &c.family, &c.defines)?;
            p.origins.insert(slot.clone(), loc.key(&["slot", &slot]));
            p.slots.insert(slot, c);
        }
        for (slot, c) in &p.slots {
            // Every fallback of the chain exists, and the chain ends.
            let at = || {
                p.origins
                    .get(slot)
                    .cloned()
                    .unwrap_or_else(|| source.to_string())
            };
            let mut seen: Vec<&str> = Vec::new();
            let mut next = c.fallback.as_deref();
            while let Some(fb) = next {
                if seen.contains(&fb) {
                    return Err(ProfileError::FallbackCycle {
                        at: at(),
                        slot: slot.clone(),
                        fallback: fb.to_string(),
                    });
                }
                seen.push(fb);
                let Some(f) = p.fallbacks.get(fb) else {
                    return Err(ProfileError::MissingFallback {
                        at: at(),
                        slot: slot.clone(),
                        fallback: fb.to_string(),
                    });
                };
                next = f.fallback.as_deref();
            }
        }
        for s in Slot::served().map(|s| s.name()) {
            p.choice(s)?;
        }
        Ok(p)
    }

    /// The choice serving `slot`: its own entry, else its group's.
    pub fn choice(&self, slot: &str) -> Result<&SlotChoice, ProfileError> {
        self.choice_for(slot, None)
    }

    /// The choice serving `slot` for weights of type `wtype` (matmul
    /// slots): `slot@TYPE`, `slot`, `group@TYPE`, then `group`.
    pub fn choice_for(&self, slot: &str, wtype: Option<&str>) -> Result<&SlotChoice, ProfileError> {
        let key = self
            .entry_for(slot, wtype)
            .ok_or_else(|| ProfileError::Unserved {
                at: self.source.clone(),
                profile: self.name.clone(),
                slot: slot.to_string(),
                group: slot_group(slot).to_string(),
            })?;
        self.slots.get(key).ok_or_else(|| ProfileError::Unserved {
            at: self.source.clone(),
            profile: self.name.clone(),
            slot: slot.to_string(),
            group: slot_group(slot).to_string(),
        })
    }

    /// The key of the `[slot.KEY]` entry serving `slot` for weights of
    /// type `wtype`, in `choice_for`'s order.
    pub fn entry_for(&self, slot: &str, wtype: Option<&str>) -> Option<&str> {
        let typed = |k: &str| wtype.map(|w| format!("{k}@{}", w.to_ascii_uppercase()));
        [
            typed(slot),
            Some(slot.to_string()),
            typed(slot_group(slot)),
            Some(slot_group(slot).to_string()),
        ]
        .into_iter()
        .flatten()
        .find_map(|k| self.slots.get_key_value(&k).map(|(k, _)| k.as_str()))
    }

    /// `FILE:LINE` of the entry serving `slot` for `wtype` (the profile's
    /// source when unknown).
    pub fn origin_of(&self, slot: &str, wtype: Option<&str>) -> &str {
        self.entry_for(slot, wtype)
            .and_then(|k| self.origins.get(k))
            .map_or(self.source.as_str(), String::as_str)
    }
}

/// The defines of a choice as the kernels crate types them.
pub fn to_defines(d: &BTreeMap<String, DefineValue>) -> Defines {
    d.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_profile_parses_and_serves_every_slot() {
        for (name, _) in BUILTIN {
            let p = Profile::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&p.name, name);
            for s in Slot::served() {
                p.choice(s.name()).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }

    #[test]
    fn bad_profiles_are_refused_with_the_reason() {
        let e =
            Profile::parse("t", "name = \"x\"\n[slot.gemmm]\nfamily = \"gemm_dq\"\n").unwrap_err();
        assert!(
            e.to_string().contains("'gemmm' is not an engine slot"),
            "{e}"
        );
        let e = Profile::parse(
            "t",
            "name = \"x\"\nbase = \"main\"\n[slot.gemm]\nfamily = \"gemm_dq\"\ndefines = { WTYPE = \"Q8_0\" }\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("WTYPE"), "{e}");
        let e =
            Profile::parse("t", "name = \"x\"\n[slot.gemm]\nfamily = \"gemm_dq\"\n").unwrap_err();
        assert!(e.to_string().contains("no choice for slot"), "{e}");
        let e = Profile::parse("t", "name = \"x\"\ntypo = 1\n").unwrap_err();
        assert!(e.to_string().contains("typo"), "{e}");
        assert!(matches!(
            Profile::load("nope"),
            Err(ProfileError::Unknown { .. })
        ));
    }

    /// An entry of a derived profile replaces the base entries it covers
    /// (same slot or a slot of its group; same weight type or none) and
    /// no others, and never the profile's own narrower entries.
    #[test]
    fn a_derived_entry_replaces_the_base_entries_it_covers() {
        for (general, narrow, covers) in [
            ("gemv", "gemv@Q4_0", true),
            ("gemv", "gemv.head", true),
            ("gemv", "gemv.head@Q6_K", true),
            ("gemv@Q8_0", "gemv.o@Q8_0", true),
            ("gemv@Q8_0", "gemv.o@q8_0", true),
            ("gemv.head", "gemv.head@Q6_K", true),
            ("gemv@Q8_0", "gemv.o@Q4_0", false),
            ("gemv@Q8_0", "gemv", false),
            ("gemv.o", "gemv@Q4_0", false),
            ("gemv.o", "gemv.ple", false),
            ("gemv", "gemv", false),
            ("gemm", "gemv@Q4_0", false),
            ("moe_gemv", "moe_gemv.down", true),
        ] {
            assert_eq!(generalizes(general, narrow), covers, "{general} / {narrow}");
        }
        let text = "name = \"x\"\nbase = \"main\"\n\n[slot.gemv]\nfamily = \"gemv\"\ndefines = { ALGO = 0 }\n\n[slot.\"gemv@Q4_K\"]\nfamily = \"gemv\"\ndefines = { ALGO = 3 }\n";
        let p = Profile::parse("x.toml", text).expect("parses");
        let main = Profile::load("main").expect("main");
        assert!(main.slots.contains_key("gemv.head@Q6_K"));
        assert!(!p.slots.contains_key("gemv.head@Q6_K"), "covered by gemv");
        assert!(!p.slots.contains_key("gemv@Q8_0"), "covered by gemv");
        assert_eq!(
            p.origin_of("gemv.down", Some("Q4_K")),
            "x.toml:8",
            "its own narrower entry"
        );
        assert_eq!(p.origin_of("gemv.head", Some("Q6_K")), "x.toml:4");
        // Other groups keep the base's entries.
        assert_eq!(p.slots.get("gemm.down"), main.slots.get("gemm.down"));
    }

    #[test]
    fn errors_and_origins_name_the_file_and_line() {
        let text = "name = \"x\"\nbase = \"main\"\n\n[slot.gemv]\nfamily = \"gemv\"\ndefines = { ALGO = 0 }\n";
        let p = Profile::parse("x.toml", text).expect("parses");
        for ty in ["F16", "Q8_0", "Q4_0", "Q6_K"] {
            assert_eq!(p.origin_of("gemv.qkv", Some(ty)), "x.toml:4", "{ty}");
        }
        // Where this profile says nothing, the base's entry and line stay.
        let narrow = "name = \"x\"\nbase = \"main\"\n\n[slot.\"gemv.o\"]\nfamily = \"gemv\"\ndefines = { ALGO = 0 }\n";
        let q = Profile::parse("x.toml", narrow).expect("parses");
        let main_line = BUILTIN[0]
            .1
            .lines()
            .position(|l| l == "[slot.\"gemv@Q4_0\"]")
            .expect("main serves gemv@Q4_0")
            + 1;
        assert_eq!(
            q.origin_of("gemv.qkv", Some("Q4_0")),
            format!("builtin:main:{main_line}")
        );
        assert_eq!(q.origin_of("gemv.o", Some("Q4_0")), "x.toml:4");
        let e = Profile::parse("x.toml", &text.replace("\"gemv\"\n", "\"gemvv\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("x.toml:5: slot 'gemv' names family 'gemvv'"),
            "{e}"
        );
        let e = Profile::parse("x.toml", &text.replace("ALGO", "ALGOO"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.toml:6: slot 'gemv' sets ALGOO"), "{e}");
        let e = Profile::parse("x.toml", &text.replace("[slot.gemv]", "[slot.gemv"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.toml:4:"), "{e}");
    }

    #[test]
    fn fallback_chains_must_exist_and_end() {
        let slot = "name = \"x\"\nbase = \"main\"\n[slot.\"attn_decode.full\"]\nfamily = \"attn_decode\"\nfallback = \"a\"\n";
        let link = |name: &str, next: &str| {
            format!("[fallback.{name}]\nfamily = \"attn_decode\"\nfallback = \"{next}\"\n")
        };
        let e = Profile::parse("t", &format!("{slot}{}", link("a", "b"))).unwrap_err();
        assert!(
            matches!(e, ProfileError::MissingFallback { ref fallback, .. } if fallback == "b"),
            "{e}"
        );
        let e = Profile::parse("t", &format!("{slot}{}{}", link("a", "b"), link("b", "a")))
            .unwrap_err();
        assert!(
            matches!(e, ProfileError::FallbackCycle { ref fallback, .. } if fallback == "a"),
            "{e}"
        );
        let p = Profile::parse(
            "t",
            &format!(
                "{slot}{}[fallback.b]\nfamily = \"attn_decode\"\n",
                link("a", "b")
            ),
        )
        .expect("a chain that ends");
        assert_eq!(p.fallbacks["a"].fallback.as_deref(), Some("b"));
    }

    #[test]
    fn a_typed_entry_wins_for_its_weight_type_only() {
        let p = Profile::load("main").expect("main");
        let q4 = p.choice_for("gemv.down", Some("Q4_0")).expect("q4");
        let q8 = p.choice_for("gemv.down", Some("Q8_0")).expect("q8");
        assert_ne!(q4.defines.get("ALGO"), q8.defines.get("ALGO"));
        assert!(Profile::parse(
            "t",
            "name = \"x\"\nbase = \"main\"\n[slot.\"gemv@Q9_9\"]\nfamily = \"gemv\"\n"
        )
        .is_err());
    }

    #[test]
    fn decode_launch_is_read_inherited_and_checked() {
        let main = Profile::load("main").expect("main").decode_launch;
        assert_ne!(main, DecodeLaunch::Plain);
        assert_eq!(Profile::load("strict").expect("strict").decode_launch, main);
        for d in [
            DecodeLaunch::Plain,
            DecodeLaunch::Chained,
            DecodeLaunch::ChainedDense,
        ] {
            let text = format!(
                "name = \"x\"\nbase = \"main\"\ndecode_launch = \"{}\"\n",
                d.name()
            );
            assert_eq!(Profile::parse("t", &text).expect("parses").decode_launch, d);
        }
        let e = Profile::parse(
            "t.toml",
            "name = \"x\"\nbase = \"main\"\ndecode_launch = \"chain\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("t.toml:3:") && e.contains("\"chained-dense\" or \"plain\""),
            "{e}"
        );
    }

    #[test]
    fn moe_route_is_read_inherited_and_checked() {
        assert!(!Profile::load("main").expect("main").moe_route_early);
        let parse = |body: &str| Profile::parse("t.toml", &format!("name = \"x\"\n{body}"));
        let early = parse("base = \"main\"\nmoe_route = \"early\"\n").expect("early");
        assert!(early.moe_route_early);
        assert!(
            !parse("base = \"main\"\nmoe_route = \"late\"\n")
                .expect("late")
                .moe_route_early
        );
        let text = "name = \"x\"\nbase = \"main\"\nmoe_route = \"early\"\n";
        let dir = std::env::temp_dir().join(format!("gemtune-moe-route-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let base = dir.join("early.toml");
        std::fs::write(&base, text).expect("write");
        let child = parse(&format!("base = \"{}\"\n", base.display())).expect("child");
        assert!(child.moe_route_early, "inherited from the base");
        let e = parse("base = \"main\"\nmoe_route = \"first\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("t.toml:3:") && e.contains("\"early\" or \"late\""),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_slot_falls_back_to_its_group() {
        let p = Profile::load("main").expect("main");
        let down = p.choice("gemm.down").expect("down");
        let qkv = p.choice("gemm.qkv").expect("qkv");
        assert!(!down.family.is_empty() && !qkv.family.is_empty());
    }
}

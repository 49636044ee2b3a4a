//! Variant specs (`variants/<family>.toml`), shapes files
//! (`variants/shapes/*.toml`), sweep expansion and per-shape plans.

pub mod doc;
pub mod expand;
pub mod family;
pub mod shapes;

pub use doc::SpecError;
pub use expand::{expand, plan, resolve, Cell, Point};
pub use family::FamilySpec;
pub use shapes::{Shape, ShapesFile};

use gemtune_kernels::family::Family;
use std::path::{Path, PathBuf};

/// The `variants/` directory: `explicit` if given, else `$GEMTUNE_VARIANTS`,
/// else the first `variants/` (with a `shapes/` inside) found walking up from
/// the current directory, else the one in the source tree this binary was
/// built from.
pub fn variants_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("GEMTUNE_VARIANTS") {
        if !p.is_empty() {
            return PathBuf::from(p);
        }
    }
    if let Ok(mut dir) = std::env::current_dir() {
        loop {
            let c = dir.join("variants");
            if c.join("shapes").is_dir() {
                return c;
            }
            if !dir.pop() {
                break;
            }
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../variants")
}

/// A shapes argument: an existing path as given, else a bare name looked up
/// in `<variants>/shapes/` (".toml" added when missing).
pub fn shapes_path(vdir: &Path, arg: &str) -> PathBuf {
    let p = PathBuf::from(arg);
    if p.exists() || arg.contains('/') {
        return p;
    }
    let mut name = arg.to_string();
    if !name.ends_with(".toml") {
        name.push_str(".toml");
    }
    vdir.join("shapes").join(name)
}

fn read(path: &Path) -> Result<(String, String), SpecError> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| SpecError::whole_file(&label, format!("cannot read: {e}")))?;
    Ok((label, text))
}

pub fn load_shapes(path: &Path) -> Result<ShapesFile, SpecError> {
    let (label, text) = read(path)?;
    ShapesFile::parse(&label, &text)
}

/// Parses a family spec and checks it against the registered family: the
/// family exists, the entry matches, every define is declared, every
/// declared define is set by each variant, and asserted contracts match the
/// kernel's.
pub fn check_against_family(spec: &FamilySpec, f: &dyn Family) -> Result<(), SpecError> {
    let at = |line: usize, msg: String| SpecError {
        file: spec.file.clone(),
        line,
        col: 1,
        msg,
    };
    if let Some((e, line)) = &spec.entry {
        if e != f.entry() {
            return Err(at(
                *line,
                format!(
                    "entry `{e}` does not match family {}'s entry `{}`",
                    f.name(),
                    f.entry()
                ),
            ));
        }
    }
    let declared = f.declared_defines();
    spec.check_declared(&declared, f.source_file())?;
    for v in &spec.variants {
        let d = spec.variant_defines(v);
        for name in &declared {
            if family::SHAPE_BOUND_DEFINES.contains(&name.as_str()) {
                continue;
            }
            if !d.contains_key(name) {
                return Err(at(
                    v.line,
                    format!(
                        "variant `{}` leaves define {name} unset ({} declares it); set it in [defaults]",
                        v.name,
                        f.source_file()
                    ),
                ));
            }
        }
    }
    for p in expand(spec) {
        let Some(want) = p.contract else { continue };
        let got = f.contract(&p.defines);
        if got != want {
            let line = spec
                .variants
                .iter()
                .find(|v| v.name == p.base)
                .and_then(|v| v.contract.map(|c| c.1))
                .or(spec.contract.map(|c| c.1))
                .unwrap_or(spec.family_line);
            return Err(at(
                line,
                format!(
                    "contract `{}` asserted, but the kernel holds variant `{}` to `{}`",
                    family::contract_name(want),
                    p.id,
                    family::contract_name(got)
                ),
            ));
        }
    }
    Ok(())
}

/// Loads `<vdir>/<name>.toml` and checks it against the registered family.
pub fn load_family(
    vdir: &Path,
    name: &str,
) -> Result<(FamilySpec, &'static dyn Family), SpecError> {
    let path = vdir.join(format!("{name}.toml"));
    if !path.exists() && gemtune_kernels::family::family(name).is_none() {
        return Err(SpecError {
            file: vdir.display().to_string(),
            line: 0,
            col: 0,
            msg: format!(
                "unknown family `{name}`; the families are {}",
                gemtune_kernels::family::families()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    let (label, text) = read(&path)?;
    let spec = FamilySpec::parse(&label, &text)?;
    if spec.family != name {
        return Err(SpecError {
            file: label,
            line: spec.family_line,
            col: 1,
            msg: format!(
                "family = \"{}\" but the file is named {name}.toml",
                spec.family
            ),
        });
    }
    let f = gemtune_kernels::family::family(name).ok_or_else(|| SpecError {
        file: label.clone(),
        line: spec.family_line,
        col: 1,
        msg: format!(
            "family `{name}` is not registered in the kernels crate (registered: {})",
            gemtune_kernels::family::families()
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })?;
    check_against_family(&spec, f)?;
    Ok((spec, f))
}

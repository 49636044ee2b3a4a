//! Per-kernel resource usage read straight from a cubin (the CUDA ELF image
//! NVRTC produces), so resource accounting and module loading do not depend
//! on the text of the ptxas `-v` log.
//!
//! # What this module relies on
//!
//! A cubin is a little-endian ELF64 file with `e_machine` = 190 (EM_CUDA).
//! The SM number sits in `e_flags`: bits 8..16 for cubins whose `EI_OSABI`
//! byte is 0x41 (what NVRTC 13 writes), bits 0..8 for the older layout.
//!
//! **Kernels.** Every kernel entry is a `STT_FUNC` symbol (global or weak
//! binding) whose `st_other` has the CUDA entry bit 0x10 set; its code lives
//! in `.text.<name>`. Device functions that were not inlined, and the
//! internal slow paths of some intrinsics, are `STT_FUNC` symbols as well but
//! without the entry bit, and are not kernels; in a whole-program compile
//! each kernel gets its own copy of them (`$<kernel>$<callee>`) inside its
//! text section.
//!
//! **`.nv.info` sections.** Sections of type `SHT_LOPROC` (0x7000_0000) named
//! `.nv.info` (module-wide) and `.nv.info.<kernel>` (one per kernel) hold a
//! packed list of attribute records. Each record starts with a 4-byte header:
//!
//! | byte | meaning |
//! |---|---|
//! | 0 | format: 1 = no value, 2 = one-byte value, 3 = two-byte value, 4 = sized payload |
//! | 1 | attribute id (`EIATTR_*`) |
//! | 2..4 | little-endian u16: for formats 1-3 the value itself (format 2 uses its low byte, format 1 ignores it); for format 4 the payload length in bytes |
//!
//! A format-4 record is followed by its payload; the next record starts right
//! after it. Any other format byte is an error: the length of such a record
//! cannot be known, so nothing after it can be trusted.
//!
//! Attributes used here (ids as ptxas numbers them):
//!
//! | id | name | where | payload |
//! |---|---|---|---|
//! | 0x2f | REGCOUNT | `.nv.info` | u32 symbol index, u32 registers per thread |
//! | 0x11 | FRAME_SIZE | `.nv.info` | u32 symbol index, u32 bytes: ptxas's "N bytes stack frame" |
//! | 0x12 | MIN_STACK_SIZE | `.nv.info` | u32 symbol index, u32 bytes: the stack including callees (ptxas's "cumulative stack size") |
//! | 0x23 | MAX_STACK_SIZE | `.nv.info` | u32 symbol index, u32 bytes (relocatable code only, filled by the linker) |
//! | 0x05 | MAX_THREADS | `.nv.info.<k>` | 3 x u32: `__launch_bounds__` maximum block |
//! | 0x10 | REQNTID | `.nv.info.<k>` | 3 x u32: required block shape |
//! | 0x19 | CBANK_PARAM_SIZE | `.nv.info.<k>` | format 3: parameter bytes |
//! | 0x17 | KPARAM_INFO | `.nv.info.<k>` | one record per parameter: u32 (0), u16 ordinal, u16 byte offset, u32 whose bits 18..32 are the size in bytes |
//! | 0x1b | MAXREG_COUNT | `.nv.info.<k>` | format 3: the register cap ptxas worked under |
//! | 0x4c | NUM_BARRIERS | `.nv.info.<k>` | format 2: named barriers used |
//!
//! The symbol-indexed attributes (payload `index, value`) are accepted from
//! any `.nv.info*` section; the others only from the kernel's own section.
//!
//! **Static shared memory** is the size of the `SHT_NOBITS` section
//! `.nv.shared.<kernel>`. A module in which no kernel touches shared memory
//! (static or dynamic) has no such sections; otherwise every kernel has one,
//! of size 0 on sm_80..sm_89 when the kernel itself declares no static
//! shared memory. On sm_90 and later every such section starts with the
//! 1 KiB the hardware reserves per block, which ptxas does not count in
//! "bytes smem": it is subtracted here, so `static_smem` is what ptxas
//! reports on every architecture.
//!
//! **Spills** are not recorded anywhere in the cubin: only frame and stack
//! sizes are. A kernel whose frame, stack and callee frames are all 0 has no
//! local memory and so no spills (recursive callees excepted, see
//! [`KernelInfo::local_bound`]); otherwise the bytes may be local arrays,
//! spills, or both.
//!
//! Every offset and length is checked: malformed input yields a
//! [`CubinError`], never a panic.

use object::elf;
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::LittleEndian;
use serde::{Deserialize, Serialize};
use thiserror::Error;

type Header = elf::FileHeader64<LittleEndian>;

/// `e_machine` of a cubin.
pub const EM_CUDA: u16 = 190;
/// `sh_type` of the `.nv.info*` attribute sections.
const SHT_CUDA_INFO: u32 = 0x7000_0000;
/// `st_other` bit that marks a kernel entry.
const STO_CUDA_ENTRY: u8 = 0x10;
/// Shared memory the sm_90+ layout places at the start of every kernel's
/// `.nv.shared.<name>` section (not part of ptxas's "bytes smem").
const SM90_RESERVED_SMEM: u64 = 1024;

/// Resources of one kernel function of a compiled module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionResources {
    pub name: String,
    pub registers: u32,
    /// Bytes of spill stores (local memory written because registers ran out).
    pub spill_bytes: u32,
    /// Stack frame bytes (local arrays plus spills).
    pub stack_bytes: u32,
    pub static_smem: u32,
}

/// `EIATTR_*` attribute ids this module interprets.
pub mod attr {
    pub const MAX_THREADS: u8 = 0x05;
    pub const REQNTID: u8 = 0x10;
    pub const FRAME_SIZE: u8 = 0x11;
    pub const MIN_STACK_SIZE: u8 = 0x12;
    pub const KPARAM_INFO: u8 = 0x17;
    pub const CBANK_PARAM_SIZE: u8 = 0x19;
    pub const MAXREG_COUNT: u8 = 0x1b;
    pub const MAX_STACK_SIZE: u8 = 0x23;
    pub const REGCOUNT: u8 = 0x2f;
    pub const NUM_BARRIERS: u8 = 0x4c;
}

/// Why a cubin could not be read.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum CubinError {
    #[error("not a cubin: {0}")]
    NotCubin(String),
    #[error("malformed cubin ELF: {0}")]
    Elf(String),
    #[error("malformed {section} at byte {offset}: {reason}")]
    NvInfo {
        section: String,
        offset: usize,
        reason: String,
    },
    #[error("kernel {kernel}: {reason}")]
    Kernel { kernel: String, reason: String },
}

fn elf_err(e: object::read::Error) -> CubinError {
    CubinError::Elf(e.to_string())
}

/// The value part of one `.nv.info` record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvInfoValue {
    /// Format 1: the attribute's presence is the information.
    None,
    /// Format 2.
    Byte(u8),
    /// Format 3.
    Half(u16),
    /// Format 4: the raw payload.
    Sized(Vec<u8>),
}

/// One attribute record of a `.nv.info*` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvInfoRecord {
    /// Byte offset of the record header within its section.
    pub offset: usize,
    /// The `EIATTR_*` id.
    pub attr: u8,
    pub value: NvInfoValue,
}

impl NvInfoRecord {
    /// The payload as little-endian u32 words; `None` unless this is a
    /// format-4 record whose length is a multiple of 4.
    pub fn words(&self) -> Option<Vec<u32>> {
        match &self.value {
            NvInfoValue::Sized(p) if p.len() % 4 == 0 => Some(
                p.chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// A single number: the value of a format 2/3 record, or a 4-byte
    /// format-4 payload.
    pub fn scalar(&self) -> Option<u32> {
        match &self.value {
            NvInfoValue::Byte(b) => Some(u32::from(*b)),
            NvInfoValue::Half(h) => Some(u32::from(*h)),
            NvInfoValue::Sized(_) => match self.words()?.as_slice() {
                [v] => Some(*v),
                _ => None,
            },
            NvInfoValue::None => None,
        }
    }

    /// `(symbol index, value)` of a symbol-indexed attribute (an 8-byte
    /// format-4 payload).
    pub fn indexed(&self) -> Option<(u32, u32)> {
        match self.words()?.as_slice() {
            [sym, v] => Some((*sym, *v)),
            _ => None,
        }
    }

    fn triple(&self) -> Option<[u32; 3]> {
        match self.words()?.as_slice() {
            [x, y, z] => Some([*x, *y, *z]),
            _ => None,
        }
    }
}

/// Splits the contents of one `.nv.info*` section into records (format
/// described in the module docs). `section` only labels errors.
pub fn parse_nv_info(section: &str, bytes: &[u8]) -> Result<Vec<NvInfoRecord>, CubinError> {
    let bad = |offset: usize, reason: String| CubinError::NvInfo {
        section: section.to_string(),
        offset,
        reason,
    };
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(&[format, attr, lo, hi]) = bytes.get(at..at + 4) else {
            return Err(bad(
                at,
                format!(
                    "{} byte(s) left, too few for a 4-byte record header",
                    bytes.len() - at
                ),
            ));
        };
        let half = u16::from_le_bytes([lo, hi]);
        let (value, next) = match format {
            1 => (NvInfoValue::None, at + 4),
            2 => (NvInfoValue::Byte(lo), at + 4),
            3 => (NvInfoValue::Half(half), at + 4),
            4 => {
                let end = at + 4 + usize::from(half);
                let Some(payload) = bytes.get(at + 4..end) else {
                    return Err(bad(
                        at,
                        format!(
                            "attribute 0x{attr:02x} claims a {half}-byte payload but only {} byte(s) follow",
                            bytes.len() - at - 4
                        ),
                    ));
                };
                (NvInfoValue::Sized(payload.to_vec()), end)
            }
            f => {
                return Err(bad(
                    at,
                    format!("unknown record format {f} (attribute 0x{attr:02x})"),
                ))
            }
        };
        out.push(NvInfoRecord {
            offset: at,
            attr,
            value,
        });
        at = next;
    }
    Ok(out)
}

/// One kernel parameter as the cubin lays it out (EIATTR_KPARAM_INFO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelParam {
    /// Position in the kernel's signature, from 0.
    pub ordinal: u32,
    /// Byte offset in the parameter buffer.
    pub offset: u32,
    pub size: u32,
}

/// A kernel's parameter buffer: what the bytes of a launch's packed
/// arguments must match (`gpu::check_args`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamLayout {
    /// Bytes of the buffer (0 for a kernel without parameters).
    pub bytes: u32,
    /// `(offset, size)` of each parameter in declaration order.
    pub params: Vec<(u32, u32)>,
}

/// What the cubin records about one kernel entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    pub name: String,
    /// Registers per thread (EIATTR_REGCOUNT).
    pub registers: u32,
    /// The kernel's own stack frame in bytes (EIATTR_FRAME_SIZE): equal to
    /// ptxas's "bytes stack frame" and an upper bound on nothing else.
    pub frame_bytes: u32,
    /// Stack including the frames of called functions (EIATTR_MIN_STACK_SIZE),
    /// when recorded.
    pub min_stack_bytes: Option<u32>,
    /// EIATTR_MAX_STACK_SIZE, when recorded (relocatable code).
    pub max_stack_bytes: Option<u32>,
    /// Largest FRAME_SIZE of the non-inlined device functions whose code
    /// sits in this kernel's text section (ptxas gives each kernel its own
    /// copy of them); 0 when there are none.
    pub callee_frame_bytes: u32,
    /// Static shared memory as ptxas counts it (reserved area excluded).
    pub static_smem: u32,
    /// Raw size of `.nv.shared.<name>`, reserved area included; `None` when
    /// the section is absent.
    pub shared_section_bytes: Option<u64>,
    /// Bytes of kernel parameters (EIATTR_CBANK_PARAM_SIZE).
    pub param_bytes: Option<u32>,
    /// The parameters in declaration order (EIATTR_KPARAM_INFO); empty for
    /// a kernel without parameters.
    pub params: Vec<KernelParam>,
    /// `__launch_bounds__` maximum block (EIATTR_MAX_THREADS).
    pub max_threads: Option<[u32; 3]>,
    /// Required block shape (EIATTR_REQNTID).
    pub required_threads: Option<[u32; 3]>,
    /// Register cap ptxas compiled under (EIATTR_MAXREG_COUNT).
    pub max_reg_count: Option<u32>,
    /// Named barriers used (EIATTR_NUM_BARRIERS); absent means none.
    pub barriers: Option<u32>,
    /// Size of the kernel's code section in bytes.
    pub code_bytes: u64,
}

impl KernelInfo {
    /// The parameter buffer's layout.
    pub fn param_layout(&self) -> ParamLayout {
        ParamLayout {
            bytes: self.param_bytes.unwrap_or(0),
            params: self.params.iter().map(|p| (p.offset, p.size)).collect(),
        }
    }

    /// Local memory the cubin admits to: the largest of the kernel's frame,
    /// its recorded stack including callees, and its callees' frames. Zero
    /// means no spill is possible, except in recursive device functions,
    /// whose frames sm_90 cubins record as 0.
    pub fn local_bound(&self) -> u32 {
        self.frame_bytes
            .max(self.min_stack_bytes.unwrap_or(0))
            .max(self.callee_frame_bytes)
    }

    /// The same counts in the shape the compile step records. Spill bytes are
    /// not in the cubin: [`local_bound`](Self::local_bound) stands in for
    /// them, so a kernel that might spill is not reported as spill-free (the
    /// number is not a byte count of spill traffic, which can exceed it).
    pub fn to_resources(&self) -> FunctionResources {
        FunctionResources {
            name: self.name.clone(),
            registers: self.registers,
            spill_bytes: self.local_bound(),
            stack_bytes: self.frame_bytes,
            static_smem: self.static_smem,
        }
    }
}

/// The parsed resource view of a cubin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cubin {
    /// SM number from `e_flags`, e.g. 90.
    pub sm: u32,
    /// Kernel entries in symbol-table order.
    pub kernels: Vec<KernelInfo>,
}

/// The checked pieces every query needs.
struct Image<'a> {
    data: &'a [u8],
    header: &'a Header,
    sections: object::read::elf::SectionTable<'a, Header, &'a [u8]>,
    symbols: object::read::elf::SymbolTable<'a, Header, &'a [u8]>,
}

/// One kernel entry symbol.
struct Entry {
    name: String,
    symbol: u32,
    text: Option<usize>,
}

/// The function symbols of an image, kernel entries apart.
struct Functions {
    entries: Vec<Entry>,
    /// (symbol index, section index) of device functions that are not entries.
    others: Vec<(u32, usize)>,
}

impl<'a> Image<'a> {
    fn open(data: &'a [u8]) -> Result<Image<'a>, CubinError> {
        let magic_ok = data.get(..4) == Some(&elf::ELFMAG[..]);
        if !magic_ok {
            return Err(CubinError::NotCubin("no ELF magic".into()));
        }
        // e_ident bytes 4 (class) and 5 (data encoding).
        if data.get(4) != Some(&elf::ELFCLASS64) || data.get(5) != Some(&elf::ELFDATA2LSB) {
            return Err(CubinError::NotCubin(
                "not a little-endian 64-bit ELF".into(),
            ));
        }
        let header = Header::parse(data).map_err(elf_err)?;
        let machine = header.e_machine(LittleEndian);
        if machine != EM_CUDA {
            return Err(CubinError::NotCubin(format!(
                "e_machine is {machine}, not {EM_CUDA} (CUDA)"
            )));
        }
        let sections = header.sections(LittleEndian, data).map_err(elf_err)?;
        let symbols = sections
            .symbols(LittleEndian, data, elf::SHT_SYMTAB)
            .map_err(elf_err)?;
        Ok(Image {
            data,
            header,
            sections,
            symbols,
        })
    }

    fn sm(&self) -> u32 {
        let flags = self.header.e_flags(LittleEndian);
        if self.header.e_ident().os_abi == 0x41 {
            (flags >> 8) & 0xff
        } else {
            flags & 0xff
        }
    }

    fn functions(&self) -> Result<Functions, CubinError> {
        let mut out = Functions {
            entries: Vec::new(),
            others: Vec::new(),
        };
        for (index, sym) in self.symbols.enumerate() {
            if sym.st_type() != elf::STT_FUNC {
                continue;
            }
            let symbol = u32::try_from(index.0)
                .map_err(|_| CubinError::Elf("symbol index past u32".into()))?;
            let section = self
                .symbols
                .symbol_section(LittleEndian, sym, index)
                .map_err(elf_err)?
                .map(|s| s.0);
            let bind = sym.st_bind();
            if sym.st_other() & STO_CUDA_ENTRY == 0
                || !(bind == elf::STB_GLOBAL || bind == elf::STB_WEAK)
            {
                if let Some(sec) = section {
                    out.others.push((symbol, sec));
                }
                continue;
            }
            let raw = self
                .symbols
                .symbol_name(LittleEndian, sym)
                .map_err(elf_err)?;
            let name = std::str::from_utf8(raw)
                .map_err(|_| CubinError::Elf("kernel symbol name is not UTF-8".into()))?;
            if name.is_empty() {
                return Err(CubinError::Elf("kernel symbol without a name".into()));
            }
            out.entries.push(Entry {
                name: name.to_string(),
                symbol,
                text: section,
            });
        }
        Ok(out)
    }

    fn name_of(&self, sh: &elf::SectionHeader64<LittleEndian>) -> Result<&'a str, CubinError> {
        let raw = self
            .sections
            .section_name(LittleEndian, sh)
            .map_err(elf_err)?;
        std::str::from_utf8(raw).map_err(|_| CubinError::Elf("section name is not UTF-8".into()))
    }

    /// Every `.nv.info*` section: (name, records).
    fn info_sections(&self) -> Result<Vec<(&'a str, Vec<NvInfoRecord>)>, CubinError> {
        let mut out = Vec::new();
        for sh in self.sections.iter() {
            if sh.sh_type(LittleEndian) != SHT_CUDA_INFO {
                continue;
            }
            let name = self.name_of(sh)?;
            if !(name == ".nv.info" || name.starts_with(".nv.info.")) {
                continue;
            }
            let bytes = sh.data(LittleEndian, self.data).map_err(elf_err)?;
            out.push((name, parse_nv_info(name, bytes)?));
        }
        Ok(out)
    }

    fn section_named(&self, name: &str) -> Option<&'a elf::SectionHeader64<LittleEndian>> {
        self.sections
            .section_by_name(LittleEndian, name.as_bytes())
            .map(|(_, sh)| sh)
    }
}

/// The parameters a kernel's own `.nv.info.<k>` records describe
/// (EIATTR_KPARAM_INFO), in declaration order. Records of another length,
/// ordinals that are not 0..n once each, or a layout whose end is not the
/// recorded parameter size are errors: the format is not what this module
/// knows, and a layout read wrong would pass wrong launches.
fn kernel_params(
    own: &[NvInfoRecord],
    param_bytes: Option<u32>,
) -> Result<Vec<KernelParam>, String> {
    let mut params = Vec::new();
    for r in own.iter().filter(|r| r.attr == attr::KPARAM_INFO) {
        let Some([_, place, flags]) = r
            .words()
            .as_deref()
            .and_then(|w| <[u32; 3]>::try_from(w).ok())
        else {
            return Err(format!(
                "KPARAM_INFO at byte {} is not a 12-byte record",
                r.offset
            ));
        };
        params.push(KernelParam {
            ordinal: place & 0xffff,
            offset: place >> 16,
            size: flags >> 18,
        });
    }
    params.sort_by_key(|p| p.ordinal);
    for (i, p) in params.iter().enumerate() {
        if p.ordinal as usize != i {
            return Err(format!(
                "KPARAM_INFO ordinals are not 0..{}: {:?}",
                params.len(),
                params.iter().map(|p| p.ordinal).collect::<Vec<_>>()
            ));
        }
    }
    let end = params.iter().map(|p| p.offset + p.size).max().unwrap_or(0);
    if end != param_bytes.unwrap_or(0) {
        return Err(format!(
            "the parameters end at byte {end} but CBANK_PARAM_SIZE says {param_bytes:?}"
        ));
    }
    Ok(params)
}

/// Names of the kernel entries, from the symbol table alone: no attribute
/// has to be understood, so this works for any well-formed cubin.
pub fn entry_names(data: &[u8]) -> Result<Vec<String>, CubinError> {
    let img = Image::open(data)?;
    Ok(img
        .functions()?
        .entries
        .into_iter()
        .map(|e| e.name)
        .collect())
}

impl Cubin {
    /// Reads every kernel's resources. A kernel without REGCOUNT or
    /// FRAME_SIZE, conflicting duplicates of those, or a shared section that
    /// does not fit the layout described in the module docs is an error: a
    /// format change must show up as an error, not as wrong numbers.
    pub fn parse(data: &[u8]) -> Result<Cubin, CubinError> {
        let img = Image::open(data)?;
        let sm = img.sm();
        let Functions { entries, others } = img.functions()?;
        let infos = img.info_sections()?;
        // FRAME_SIZE of every symbol, for the callees.
        let frames: Vec<(u32, u32)> = infos
            .iter()
            .flat_map(|(_, recs)| recs.iter())
            .filter(|r| r.attr == attr::FRAME_SIZE)
            .filter_map(NvInfoRecord::indexed)
            .collect();
        let mut kernels = Vec::with_capacity(entries.len());
        for e in &entries {
            let bad = |reason: String| CubinError::Kernel {
                kernel: e.name.clone(),
                reason,
            };
            // One symbol-indexed attribute of this kernel from any section.
            let indexed = |id: u8, what: &str| -> Result<Option<u32>, CubinError> {
                let mut found: Option<u32> = None;
                for (_, recs) in &infos {
                    for r in recs.iter().filter(|r| r.attr == id) {
                        let Some((sym, v)) = r.indexed() else {
                            continue;
                        };
                        if sym != e.symbol {
                            continue;
                        }
                        match found {
                            Some(old) if old != v => {
                                return Err(bad(format!("{what} recorded twice: {old} and {v}")))
                            }
                            _ => found = Some(v),
                        }
                    }
                }
                Ok(found)
            };
            let registers = indexed(attr::REGCOUNT, "REGCOUNT")?
                .ok_or_else(|| bad("no REGCOUNT attribute".into()))?;
            let frame_bytes = indexed(attr::FRAME_SIZE, "FRAME_SIZE")?
                .ok_or_else(|| bad("no FRAME_SIZE attribute".into()))?;
            let min_stack_bytes = indexed(attr::MIN_STACK_SIZE, "MIN_STACK_SIZE")?;
            let max_stack_bytes = indexed(attr::MAX_STACK_SIZE, "MAX_STACK_SIZE")?;
            let callee_frame_bytes = others
                .iter()
                .filter(|(_, sec)| Some(*sec) == e.text)
                .flat_map(|(sym, _)| frames.iter().filter(move |(s, _)| s == sym))
                .map(|(_, v)| *v)
                .max()
                .unwrap_or(0);

            let own_name = format!(".nv.info.{}", e.name);
            let own: &[NvInfoRecord] = infos
                .iter()
                .find(|(n, _)| *n == own_name)
                .map(|(_, r)| r.as_slice())
                .unwrap_or(&[]);
            let last = |id: u8| own.iter().rev().find(|r| r.attr == id);
            let param_bytes = last(attr::CBANK_PARAM_SIZE).and_then(NvInfoRecord::scalar);
            let params = kernel_params(own, param_bytes).map_err(bad)?;
            let max_threads = last(attr::MAX_THREADS).and_then(NvInfoRecord::triple);
            let required_threads = last(attr::REQNTID).and_then(NvInfoRecord::triple);
            let max_reg_count = last(attr::MAXREG_COUNT).and_then(NvInfoRecord::scalar);
            let barriers = last(attr::NUM_BARRIERS).and_then(NvInfoRecord::scalar);

            let shared_section_bytes = match img.section_named(&format!(".nv.shared.{}", e.name)) {
                Some(sh) if sh.sh_type(LittleEndian) == elf::SHT_NOBITS => {
                    Some(sh.sh_size(LittleEndian))
                }
                Some(sh) => {
                    return Err(bad(format!(
                        "shared section has type 0x{:x}, not NOBITS",
                        sh.sh_type(LittleEndian)
                    )))
                }
                None => None,
            };
            let static_smem = match shared_section_bytes {
                None => 0,
                Some(size) => {
                    let reserved = if sm >= 90 { SM90_RESERVED_SMEM } else { 0 };
                    let user = size.checked_sub(reserved).ok_or_else(|| {
                        bad(format!(
                            "shared section of {size} bytes is smaller than the {reserved} bytes sm_{sm} reserves"
                        ))
                    })?;
                    u32::try_from(user)
                        .map_err(|_| bad(format!("{user} bytes of static shared memory")))?
                }
            };
            let code_bytes = match e.text {
                Some(i) => img
                    .sections
                    .section(object::SectionIndex(i))
                    .map_err(elf_err)?
                    .sh_size(LittleEndian),
                None => 0,
            };
            kernels.push(KernelInfo {
                name: e.name.clone(),
                registers,
                frame_bytes,
                min_stack_bytes,
                max_stack_bytes,
                callee_frame_bytes,
                static_smem,
                shared_section_bytes,
                param_bytes,
                params,
                max_threads,
                required_threads,
                max_reg_count,
                barriers,
                code_bytes,
            });
        }
        Ok(Cubin { sm, kernels })
    }

    /// A kernel by name.
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// Per-function resources in the compile step's shape (see
    /// [`KernelInfo::to_resources`] for what spill bytes mean here).
    pub fn resources(&self) -> Vec<FunctionResources> {
        self.kernels.iter().map(KernelInfo::to_resources).collect()
    }

    /// Differences between these counts and ptxas's (`log`, as parsed by
    /// `compile::parse_ptxas_log`): entries present on one side only, and
    /// registers, static shared memory or stack frame that disagree. Empty
    /// when the two sources agree.
    pub fn differences(&self, log: &[FunctionResources]) -> Vec<String> {
        let mut out = Vec::new();
        for k in &self.kernels {
            let Some(f) = log.iter().find(|f| f.name == k.name) else {
                out.push(format!("{}: in the cubin but not in the ptxas log", k.name));
                continue;
            };
            let mut cmp = |what: &str, cubin: u32, ptxas: u32| {
                if cubin != ptxas {
                    out.push(format!("{}: {what} cubin {cubin} vs ptxas {ptxas}", k.name));
                }
            };
            cmp("registers", k.registers, f.registers);
            cmp("static smem", k.static_smem, f.static_smem);
            cmp("stack frame", k.frame_bytes, f.stack_bytes);
        }
        for f in log {
            if self.kernel(&f.name).is_none() {
                out.push(format!("{}: in the ptxas log but not in the cubin", f.name));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{compile_source, nvrtc_available, parse_ptxas_log, Arch, BASE_OPTIONS};
    use crate::compile::{CompiledVariant, ResourceSource};
    use rand::{Rng, SeedableRng};

    /// Kernels that exercise each attribute: a local-memory frame, heavy
    /// spills under launch bounds, static shared memory, dynamic-only shared
    /// memory, both, a recursive callee and a mangled template instance.
    const EDGE: &str = r#"
__device__ __noinline__ int rec(const int* p, int n) {
    volatile int a[24];
    for (int j = 0; j < 24; j++) a[j] = p[j] + n;
    if (n <= 0) return a[n & 7];
    return a[(n * 3) % 24] + rec(p + 1, n - 1);
}
extern "C" __global__ void k_frame(const float* p, float* o, const int* idx) {
    float loc[64];
    for (int j = 0; j < 64; j++) loc[j] = p[j * blockDim.x + threadIdx.x];
    float s = 0.0f;
    for (int j = 0; j < 64; j++) s += loc[idx[j] & 63];
    o[threadIdx.x] = s;
}
extern "C" __global__ void __launch_bounds__(1024, 2) k_spill(const float* p, float* o) {
    float acc[160];
#pragma unroll
    for (int j = 0; j < 160; j++) acc[j] = p[j * blockDim.x + threadIdx.x];
#pragma unroll
    for (int r = 0; r < 3; r++)
#pragma unroll
        for (int j = 0; j < 160; j++) acc[j] = acc[j] * acc[(j * 7 + r) % 160] + 1.0f;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 160; j++) s += acc[j];
    o[threadIdx.x] = s;
}
extern "C" __global__ void k_static(float* o) {
    __shared__ float s[300];
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = s[(threadIdx.x + 1) % 300];
}
extern "C" __global__ void k_dynamic(float* o) {
    extern __shared__ float d[];
    d[threadIdx.x] = threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = d[(threadIdx.x + 1) % 300];
}
extern "C" __global__ void k_both(float* o) {
    extern __shared__ float d[];
    __shared__ double s2[7];
    if (threadIdx.x < 7) s2[threadIdx.x] = 1.0;
    d[threadIdx.x] = threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = d[(threadIdx.x + 1) % 300] + s2[threadIdx.x % 7];
}
extern "C" __global__ void k_rec(const int* p, int* o, int n) {
    o[threadIdx.x] = rec(p, n);
}
template <int N> __global__ void k_tmpl(float* o) { o[threadIdx.x] = N * 1.5f; }
template __global__ void k_tmpl<4>(float*);
"#;

    /// A module without any shared memory (so no `.nv.shared.*` sections).
    const PLAIN: &str = r#"
extern "C" __global__ void k_plain(float* o, float a) { o[threadIdx.x] = a / (threadIdx.x + 1.0f); }
"#;

    fn build(src: &str, arch: Arch) -> CompiledVariant {
        assert!(
            nvrtc_available(),
            "NVRTC is needed (. scripts/nvrtc-env.sh)"
        );
        let mut options: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
        options.push(format!("--gpu-architecture={arch}"));
        compile_source(
            "cubin-test",
            "cubin_test.cu",
            src,
            &Default::default(),
            &options,
            arch,
            None,
        )
        .unwrap_or_else(|e| panic!("{arch}: {e}"))
    }

    #[test]
    fn edge_kernels_match_ptxas_on_every_arch() {
        for arch in [80, 86, 89, 90, 100, 120].map(Arch) {
            for src in [EDGE, PLAIN] {
                let cv = build(src, arch);
                assert_eq!(cv.resources_source, ResourceSource::PtxasLog);
                let c = Cubin::parse(&cv.cubin).unwrap_or_else(|e| panic!("{arch}: {e}"));
                assert_eq!(c.sm, arch.0);
                let log = parse_ptxas_log(&cv.log);
                let diffs = c.differences(&log);
                assert!(diffs.is_empty(), "{arch}: {diffs:#?}\n{}", cv.log);
                assert_eq!(entry_names(&cv.cubin).unwrap().len(), log.len());
                for f in &log {
                    let k = c.kernel(&f.name).unwrap();
                    // The stand-in for spill bytes is never zero when ptxas
                    // counted spills (recursion on sm_90+ excepted, see
                    // local_bound).
                    let recursive_on_sm90 = f.name == "k_rec" && arch.0 >= 90;
                    assert!(
                        f.spill_bytes == 0 || k.local_bound() > 0 || recursive_on_sm90,
                        "{arch}: {f:?} vs {k:?}"
                    );
                }
            }
            let c = Cubin::parse(&build(EDGE, arch).cubin).unwrap();
            let k = |n: &str| c.kernel(n).unwrap_or_else(|| panic!("{n} missing"));
            assert_eq!(k("k_static").static_smem, 1200);
            assert_eq!(k("k_dynamic").static_smem, 0);
            assert_eq!(k("k_both").static_smem, 64);
            assert!(k("k_frame").frame_bytes >= 160, "{:?}", k("k_frame"));
            assert!(k("k_spill").frame_bytes > 0);
            assert_eq!(k("k_spill").max_threads, Some([1024, 1, 1]));
            assert_eq!(k("k_spill").param_bytes, Some(16));
            assert_eq!(
                k("k_spill").param_layout(),
                ParamLayout {
                    bytes: 16,
                    params: vec![(0, 8), (8, 8)]
                }
            );
            // (int*, int*, int): the int at 16, no padding after it.
            assert_eq!(
                k("k_rec").param_layout(),
                ParamLayout {
                    bytes: 20,
                    params: vec![(0, 8), (8, 8), (16, 4)]
                }
            );
            assert_eq!(k("k_static").barriers, Some(1));
            assert!(c.kernel("_Z6k_tmplILi4EEvPf").is_some(), "{c:?}");
            // A module with no shared memory at all.
            let p = Cubin::parse(&build(PLAIN, arch).cubin).unwrap();
            assert_eq!(p.kernels[0].shared_section_bytes, None);
            assert_eq!(p.kernels[0].static_smem, 0);
            // (float*, float): 12 bytes.
            assert_eq!(
                p.kernels[0].param_layout(),
                ParamLayout {
                    bytes: 12,
                    params: vec![(0, 8), (8, 4)]
                }
            );
        }
    }

    /// Parameters of every size and alignment, out-of-order records, and the
    /// records a parse must refuse.
    #[test]
    fn kernel_params_are_read_in_declaration_order() {
        let cv = build(
            r#"
struct S3 { int x, y, z; };
extern "C" __global__ void k_mixed(int b, const double* a, S3 s, char c, unsigned long long u, float* o) {
    o[threadIdx.x] = a[b] + s.x + c + (float)u;
}
extern "C" __global__ void k_none() {}
"#,
            Arch(90),
        );
        let c = Cubin::parse(&cv.cubin).unwrap();
        let k = c.kernel("k_mixed").unwrap();
        assert_eq!(
            k.param_layout(),
            ParamLayout {
                bytes: 48,
                params: vec![(0, 4), (8, 8), (16, 12), (28, 1), (32, 8), (40, 8)]
            }
        );
        assert_eq!(
            c.kernel("k_none").unwrap().param_layout(),
            ParamLayout::default()
        );

        let rec = |ordinal: u32, offset: u32, size: u32| {
            let mut payload = Vec::new();
            payload.extend_from_slice(&0u32.to_le_bytes());
            payload.extend_from_slice(&(ordinal | offset << 16).to_le_bytes());
            payload.extend_from_slice(&(0x1f000 | size << 18).to_le_bytes());
            NvInfoRecord {
                offset: 0,
                attr: attr::KPARAM_INFO,
                value: NvInfoValue::Sized(payload),
            }
        };
        let ok = kernel_params(&[rec(1, 8, 4), rec(0, 0, 8)], Some(12)).unwrap();
        assert_eq!(
            ok.iter()
                .map(|p| (p.ordinal, p.offset, p.size))
                .collect::<Vec<_>>(),
            vec![(0, 0, 8), (1, 8, 4)]
        );
        assert!(kernel_params(&[rec(0, 0, 8), rec(2, 8, 4)], Some(12))
            .unwrap_err()
            .contains("ordinals"));
        assert!(kernel_params(&[rec(0, 0, 8), rec(1, 8, 4)], Some(16))
            .unwrap_err()
            .contains("CBANK_PARAM_SIZE"));
        let short = NvInfoRecord {
            offset: 4,
            attr: attr::KPARAM_INFO,
            value: NvInfoValue::Sized(vec![0; 8]),
        };
        assert!(kernel_params(&[short], Some(8))
            .unwrap_err()
            .contains("12-byte"));
    }

    /// File ranges (offset, size) of the sections a parse reads most:
    /// headers, symbols, strings and `.nv.info*`.
    fn hot_ranges(data: &[u8]) -> Vec<(usize, usize)> {
        let h = Header::parse(data).unwrap();
        let sections = h.sections(LittleEndian, data).unwrap();
        let mut out = vec![(0, 64)];
        let shoff = h.e_shoff(LittleEndian) as usize;
        out.push((shoff, sections.len() * 64));
        for sh in sections.iter() {
            let t = sh.sh_type(LittleEndian);
            if t == SHT_CUDA_INFO || t == elf::SHT_SYMTAB || t == elf::SHT_STRTAB {
                let off = sh.sh_offset(LittleEndian) as usize;
                let size = sh.sh_size(LittleEndian) as usize;
                if size > 0 {
                    out.push((off, size));
                }
            }
        }
        out
    }

    /// Truncated and randomly corrupted cubins give Ok or a typed error,
    /// never a panic (a panic fails the test).
    #[test]
    fn truncated_and_corrupted_cubins_never_panic() {
        for arch in [Arch(80), Arch(90)] {
            let good = build(EDGE, arch).cubin;
            let small = build(PLAIN, arch).cubin;
            assert!(Cubin::parse(&good).is_ok());
            // Every prefix of the small module, and a stride through the big one.
            for n in 0..small.len() {
                let r = Cubin::parse(&small[..n]);
                assert!(
                    r.is_err() || n > small.len() / 2,
                    "{arch}: prefix {n} parsed"
                );
                let _ = entry_names(&small[..n]);
            }
            for n in (0..good.len()).step_by(97) {
                let _ = Cubin::parse(&good[..n]);
            }
            let hot = hot_ranges(&good);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x6375_6269 + u64::from(arch.0));
            let mut errors = 0usize;
            for round in 0..3000 {
                let mut bad = good.clone();
                for _ in 0..rng.random_range(1..=8) {
                    // Two rounds in three hit the structures the parser walks.
                    let at = if round % 3 == 0 {
                        rng.random_range(0..bad.len())
                    } else {
                        let (off, size) = hot[rng.random_range(0..hot.len())];
                        (off + rng.random_range(0..size)).min(bad.len() - 1)
                    };
                    bad[at] = match rng.random_range(0..4) {
                        0 => 0,
                        1 => 0xff,
                        2 => bad[at] ^ (1 << rng.random_range(0..8)),
                        _ => rng.random(),
                    };
                }
                if Cubin::parse(&bad).is_err() {
                    errors += 1;
                }
                let _ = entry_names(&bad);
            }
            assert!(
                errors > 100,
                "{arch}: only {errors} corruptions were detected"
            );
        }
    }

    /// Targeted damage to the attributes gives the matching typed error.
    #[test]
    fn damaged_attributes_give_typed_errors() {
        let good = build(EDGE, Arch(90)).cubin;
        let h = Header::parse(&good[..]).unwrap();
        let sections = h.sections(LittleEndian, &good[..]).unwrap();
        let (_, info) = sections.section_by_name(LittleEndian, b".nv.info").unwrap();
        let off = info.sh_offset(LittleEndian) as usize;
        let size = info.sh_size(LittleEndian) as usize;
        let recs = parse_nv_info(".nv.info", &good[off..off + size]).unwrap();

        // Renaming every REGCOUNT record leaves the kernels without one.
        let mut no_regs = good.clone();
        for r in recs.iter().filter(|r| r.attr == attr::REGCOUNT) {
            no_regs[off + r.offset + 1] = 0x7e;
        }
        let e = Cubin::parse(&no_regs).unwrap_err();
        assert!(
            matches!(&e, CubinError::Kernel { reason, .. } if reason.contains("REGCOUNT")),
            "{e}"
        );
        // entry_names needs no attribute.
        assert_eq!(entry_names(&no_regs).unwrap(), entry_names(&good).unwrap());

        // A payload length that runs past the section.
        let mut long = good.clone();
        long[off + 2..off + 4].copy_from_slice(&0xfff0u16.to_le_bytes());
        let e = Cubin::parse(&long).unwrap_err();
        assert!(matches!(e, CubinError::NvInfo { offset: 0, .. }), "{e}");

        // An unknown record format.
        let mut fmt = good.clone();
        fmt[off] = 7;
        let e = Cubin::parse(&fmt).unwrap_err();
        assert!(e.to_string().contains("unknown record format 7"), "{e}");

        // Two different register counts for one kernel.
        let first = recs.iter().find(|r| r.attr == attr::REGCOUNT).unwrap();
        let (sym, regs) = first.indexed().unwrap();
        let other = recs
            .iter()
            .find(|r| r.attr == attr::FRAME_SIZE && r.indexed().is_some_and(|(s, _)| s == sym))
            .unwrap();
        let mut twice = good.clone();
        twice[off + other.offset + 1] = attr::REGCOUNT;
        let v = off + other.offset + 8;
        twice[v..v + 4].copy_from_slice(&(regs + 1).to_le_bytes());
        let e = Cubin::parse(&twice).unwrap_err();
        assert!(e.to_string().contains("REGCOUNT recorded twice"), "{e}");

        // The entry bit cleared on every symbol: no kernels, no error.
        let symtab = sections
            .iter()
            .find(|s| s.sh_type(LittleEndian) == elf::SHT_SYMTAB)
            .unwrap();
        let mut no_entries = good.clone();
        let base = symtab.sh_offset(LittleEndian) as usize;
        for i in 0..symtab.sh_size(LittleEndian) as usize / 24 {
            no_entries[base + i * 24 + 5] &= !STO_CUDA_ENTRY;
        }
        assert!(Cubin::parse(&no_entries).unwrap().kernels.is_empty());
    }

    fn rec(format: u8, attr: u8, half: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![format, attr];
        v.extend_from_slice(&half.to_le_bytes());
        v.extend_from_slice(payload);
        v
    }

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn nv_info_records_of_every_format() {
        let mut bytes = Vec::new();
        bytes.extend(rec(4, attr::REGCOUNT, 8, &words(&[12, 27])));
        bytes.extend(rec(1, 0x35, 0, &[]));
        bytes.extend(rec(2, attr::NUM_BARRIERS, 0x0001, &[]));
        bytes.extend(rec(3, attr::CBANK_PARAM_SIZE, 0x20, &[]));
        bytes.extend(rec(4, attr::MAX_THREADS, 12, &words(&[256, 1, 1])));
        let r = parse_nv_info(".nv.info.k", &bytes).unwrap();
        assert_eq!(r.len(), 5);
        assert_eq!(r[0].indexed(), Some((12, 27)));
        assert_eq!(r[1].value, NvInfoValue::None);
        assert_eq!(r[2].scalar(), Some(1));
        assert_eq!(r[3].scalar(), Some(32));
        assert_eq!(r[4].triple(), Some([256, 1, 1]));
        assert_eq!(r[4].offset, 12 + 4 + 4 + 4);
        assert_eq!(parse_nv_info("x", &[]).unwrap(), vec![]);
    }

    #[test]
    fn nv_info_errors_are_typed() {
        let good = rec(4, attr::REGCOUNT, 8, &words(&[1, 2]));
        // Every truncation of a sized record fails cleanly.
        for n in 1..good.len() {
            let e = parse_nv_info(".nv.info", &good[..n]).unwrap_err();
            assert!(matches!(e, CubinError::NvInfo { offset: 0, .. }), "{e}");
        }
        let e = parse_nv_info(".nv.info", &rec(9, 1, 0, &[])).unwrap_err();
        assert!(e.to_string().contains("unknown record format 9"), "{e}");
        // A payload length past the end, after one good record.
        let mut b = rec(3, 1, 7, &[]);
        b.extend(rec(4, 2, 0xffff, &[0; 8]));
        let e = parse_nv_info(".nv.info", &b).unwrap_err();
        assert!(matches!(e, CubinError::NvInfo { offset: 4, .. }), "{e}");
    }

    #[test]
    fn non_cubins_are_rejected() {
        assert!(matches!(Cubin::parse(b""), Err(CubinError::NotCubin(_))));
        assert!(matches!(
            Cubin::parse(b"\x7fELF\x01\x01\x01"),
            Err(CubinError::NotCubin(_))
        ));
        // A 64-bit little-endian header that is cut short.
        let mut h = vec![0u8; 20];
        h[..4].copy_from_slice(&elf::ELFMAG);
        h[4] = elf::ELFCLASS64;
        h[5] = elf::ELFDATA2LSB;
        h[6] = elf::EV_CURRENT;
        assert!(matches!(Cubin::parse(&h), Err(CubinError::Elf(_))));
        assert!(entry_names(&h).is_err());
        // A complete header for another machine (x86-64).
        h.resize(64, 0);
        h[18..20].copy_from_slice(&62u16.to_le_bytes());
        let e = Cubin::parse(&h).unwrap_err();
        assert!(e.to_string().contains("e_machine is 62"), "{e}");
    }
}

//! Every kind of bad GGUF input gives a typed error naming the file and the
//! item, and nothing panics. Each test builds its bad file byte by byte.

use gemtune_engine::gguf::{
    GgufError, GgufErrorKind, GgufFile, GgufValue, GgufValueType, GgufWriter, TensorInfo,
    MAX_ARRAY_DEPTH,
};
use gemtune_kernels::quant::GgmlType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const LABEL: &str = "bad.gguf";

/// A hand-assembled GGUF byte stream.
#[derive(Clone)]
struct Raw(Vec<u8>);

impl Raw {
    /// Magic, version and the two counts.
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
    }
    fn u8(mut self, v: u8) -> Raw {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A metadata entry with a u32 value.
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(GgufValueType::U32.id()).u32(v)
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    fn pad_to(mut self, align: usize) -> Raw {
        let n = self.0.len().next_multiple_of(align);
        self.0.resize(n, 0);
        self
    }
    fn zeros(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    fn parse(self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0, LABEL)
    }
}

/// Parses, expects an error, checks the message names the file and `item`.
fn fail(raw: Raw, item: &str) -> GgufError {
    let e = raw.parse().expect_err("bad input must be rejected");
    let msg = e.to_string();
    assert_eq!(e.item(), item, "item of: {msg}");
    assert!(
        msg.starts_with(&format!("{LABEL}: {item}: ")),
        "message must name file and item: {msg}"
    );
    e
}

/// A valid file with one F32 [4] tensor at offset 0.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data: usize) -> Raw {
    Raw::header(3, 1, 0)
        .tensor("w", dims, ty, offset)
        .pad_to(32)
        .zeros(data)
}

#[test]
fn good_hand_built_file_parses() {
    let f = Raw::header(3, 1, 1)
        .kv_u32("k", 7)
        .tensor("w", &[4], 0, 0)
        .pad_to(32)
        .bytes(&1.5f32.to_le_bytes())
        .zeros(12)
        .parse()
        .expect("valid");
    assert_eq!(f.get_u64("k"), Some(7));
    assert_eq!(&f.tensor_data(&f.tensors()[0])[..4], &1.5f32.to_le_bytes());
}

#[test]
fn hand_built_version_2_file_parses() {
    let f = Raw::header(2, 1, 1)
        .kv_u32("general.alignment", 16)
        .tensor("w", &[2], 0, 0)
        .pad_to(16)
        .bytes(&7.0f32.to_le_bytes())
        .bytes(&(-1.0f32).to_le_bytes())
        .parse()
        .expect("v2");
    assert_eq!((f.version(), f.alignment()), (2, 16));
    assert_eq!(f.data_offset() % 16, 0);
    let d = f.tensor_data(&f.tensors()[0]);
    assert_eq!(d[..4], 7.0f32.to_le_bytes());
    assert_eq!(d[4..], (-1.0f32).to_le_bytes());
}

#[test]
fn empty_file() {
    let e = fail(Raw(Vec::new()), "magic");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::Truncated {
            needed: 4,
            file_len: 0,
            ..
        }
    ));
}

#[test]
fn bad_magic() {
    let e = fail(Raw(b"GGML\x03\0\0\0".to_vec()).u64(0).u64(0), "magic");
    assert!(matches!(e.kind(), GgufErrorKind::BadMagic { .. }));
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
}

#[test]
fn version_1_is_unsupported() {
    let e = fail(Raw::header(1, 0, 0), "version");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::UnsupportedVersion { version: 1 }
    ));
    assert!(e.to_string().contains("unsupported GGUF version 1"), "{e}");
}

#[test]
fn future_version_is_unsupported() {
    let e = fail(Raw::header(4, 0, 0), "version");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::UnsupportedVersion { version: 4 }
    ));
    let e = fail(Raw::header(0, 0, 0), "version");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::UnsupportedVersion { version: 0 }
    ));
}

#[test]
fn big_endian_file_is_rejected() {
    // A big-endian writer stores version 3 as 00 00 00 03.
    let raw = Raw(b"GGUF".to_vec())
        .bytes(&3u32.to_be_bytes())
        .bytes(&0u64.to_be_bytes())
        .bytes(&0u64.to_be_bytes());
    let e = fail(raw, "version");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::BigEndian { swapped: 3, .. }
    ));
    assert!(e.to_string().contains("big-endian"), "{e}");
}

#[test]
fn truncated_in_header_counts() {
    let e = fail(Raw(b"GGUF".to_vec()).u32(3).u32(0), "tensor count");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::Truncated {
            offset: 8,
            needed: 8,
            file_len: 12,
            ..
        }
    ));
    let e = fail(Raw(b"GGUF".to_vec()).u32(3).u64(0), "metadata count");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::Truncated { offset: 16, .. }
    ));
    let e = fail(Raw(b"GGU".to_vec()), "magic");
    assert!(matches!(e.kind(), GgufErrorKind::Truncated { .. }));
}

#[test]
fn truncated_in_key() {
    // The key claims 100 bytes; 16 are left.
    let raw = Raw::header(3, 0, 1)
        .u64(100)
        .bytes(b"general.name")
        .zeros(4);
    let e = fail(raw, "metadata key #0");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::Truncated {
            offset: 32,
            needed: 100,
            ..
        }
    ));
    assert!(e.to_string().contains("key of 100 bytes"), "{e}");
    // Too short even for the declared number of entries.
    let mut raw = Raw::header(3, 0, 1).kv_u32("general.name", 1);
    raw.0.truncate(24 + 8 + 4);
    let e = fail(raw, "metadata count");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::CountTooLarge {
            count: 1,
            min_each: 13,
            remaining: 12,
            ..
        }
    ));
}

#[test]
fn truncated_in_value() {
    let mut raw = Raw::header(3, 0, 1).kv_u32("k", 1);
    raw.0.pop();
    let e = fail(raw, "metadata 'k'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::Truncated { needed: 4, .. }
    ));
    // Inside a string array element.
    let raw = Raw::header(3, 0, 1)
        .str("tokens")
        .u32(GgufValueType::Array.id())
        .u32(GgufValueType::String.id())
        .u64(2)
        .str("ab")
        .u64(5)
        .bytes(b"cd");
    let e = fail(raw, "metadata 'tokens'");
    assert!(
        matches!(e.kind(), GgufErrorKind::Truncated { needed: 5, .. }),
        "{e}"
    );
}

#[test]
fn truncated_in_tensor_info() {
    let full = Raw::header(3, 1, 0).tensor("blk.0.attn_q.weight", &[4, 4], 0, 0);
    let mut cut = full.clone();
    cut.0.truncate(full.0.len() - 3); // inside the offset
    let e = fail(cut, "tensor 'blk.0.attn_q.weight'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::Truncated { needed: 8, .. }
    ));
    assert!(e.to_string().contains("data offset"), "{e}");
    let mut cut = full.clone();
    cut.0.truncate(24 + 8 + 17); // inside the name, 25 bytes left
    let e = fail(cut, "tensor info #0");
    assert!(matches!(e.kind(), GgufErrorKind::Truncated { .. }));
}

#[test]
fn truncated_in_data() {
    // 16 bytes of data needed, 10 present.
    let raw = one_tensor(&[4], 0, 0, 10);
    let e = fail(raw, "tensor 'w'");
    match e.kind() {
        GgufErrorKind::DataPastEnd { end, file_len, .. } => assert_eq!(end - file_len, 6),
        k => panic!("wrong kind {k:?}"),
    }
    assert!(e.to_string().contains("past the end of the file"), "{e}");
}

#[test]
fn every_truncation_of_a_rich_file_is_an_error_not_a_panic() {
    let mut w = GgufWriter::new().with_alignment(64);
    w.add_metadata("s", GgufValue::from("hello"));
    w.add_metadata("f", GgufValue::F64(1.0));
    w.add_metadata("b", GgufValue::Bool(true));
    w.add_metadata(
        "aoa",
        GgufValue::array(
            GgufValueType::Array,
            [GgufValue::array(GgufValueType::String, ["x", "yy"])],
        ),
    );
    w.add_tensor("a", vec![8], GgmlType::F32).expect("a");
    w.add_tensor("b", vec![32, 2], GgmlType::Q8_0).expect("b");
    let bytes = w
        .write_to_vec(|_, _, d: &mut [u8]| {
            d.fill(0x5a);
            Ok::<(), String>(())
        })
        .expect("write");
    let full = GgufFile::from_bytes(bytes.clone(), LABEL).expect("full file parses");
    let header_end = 24
        + full
            .metadata()
            .iter()
            .map(|(k, v)| 8 + k.len() + 4 + v.encoded_len() as usize)
            .sum::<usize>()
        + full
            .tensors()
            .iter()
            .map(|t| 8 + t.name.len() + 4 + 8 * t.dims.len() + 4 + 8)
            .sum::<usize>();
    assert_eq!(full.data_offset() as usize, header_end.div_ceil(64) * 64);
    let last_end = (full.data_offset() + 64 + 68) as usize;
    for cut in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..cut].to_vec(), LABEL);
        if cut >= last_end {
            // Only trailing padding is missing: still a valid file.
            assert!(
                r.is_ok(),
                "cut at {cut}: {:?}",
                r.err().map(|e| e.to_string())
            );
            continue;
        }
        let e = r.expect_err("truncated file must fail");
        assert!(e.to_string().starts_with("bad.gguf: "), "{e}");
        if cut < header_end {
            // Either the item that runs off the end fails, or an earlier
            // declared count/length no longer fits in what is left.
            assert!(
                matches!(
                    e.kind(),
                    GgufErrorKind::Truncated { .. }
                        | GgufErrorKind::CountTooLarge { .. }
                        | GgufErrorKind::ArrayTooLong { .. }
                ),
                "cut at {cut}: {e}"
            );
        } else {
            assert!(
                matches!(e.kind(), GgufErrorKind::DataPastEnd { .. }),
                "cut at {cut}: {e}"
            );
        }
    }
}

#[test]
fn random_corruption_never_panics() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", GgufValue::from("gemma4"));
    w.add_metadata("arr", GgufValue::array(GgufValueType::U32, [1u32, 2, 3, 4]));
    w.add_metadata(
        "aoa",
        GgufValue::array(
            GgufValueType::Array,
            [GgufValue::array(GgufValueType::I8, [1i8, -1])],
        ),
    );
    w.add_tensor("t0", vec![32, 2], GgmlType::Q8_0).expect("t0");
    w.add_tensor("t1", vec![3, 5], GgmlType::F16).expect("t1");
    let good = w
        .write_to_vec(|_, _, _| Ok::<(), String>(()))
        .expect("write");
    let mut rng = ChaCha8Rng::seed_from_u64(0x6767_7566);
    let mut rejected = 0;
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..b.len());
            b[i] = match rng.random_range(0..3) {
                0 => rng.random(),
                1 => 0xff,
                _ => b[i] ^ (1 << rng.random_range(0..8)),
            };
        }
        if rng.random_bool(0.2) {
            let n = rng.random_range(0..b.len());
            b.truncate(n);
        }
        match GgufFile::from_bytes(b, LABEL) {
            Ok(f) => {
                // Whatever parsed must be internally consistent.
                for t in f.tensors() {
                    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes());
                }
            }
            Err(e) => {
                assert!(e.to_string().starts_with("bad.gguf: "));
                rejected += 1;
            }
        }
    }
    assert!(rejected > 1000, "only {rejected} corruptions rejected");
}

#[test]
fn tensor_data_past_end_of_file() {
    // Offset 1024 with only 16 data bytes present.
    let e = fail(one_tensor(&[4], 0, 1024, 16), "tensor 'w'");
    assert!(matches!(e.kind(), GgufErrorKind::DataPastEnd { .. }));
    // Size past the end: 1000 elements, 16 bytes present.
    let e = fail(one_tensor(&[1000], 0, 0, 16), "tensor 'w'");
    match e.kind() {
        GgufErrorKind::DataPastEnd {
            start,
            end,
            file_len,
        } => {
            assert_eq!(end - start, 4000);
            assert_eq!(
                e.to_string(),
                format!(
                    "bad.gguf: tensor 'w': data ends at byte {end} past the end of the file ({file_len} bytes)"
                )
            );
        }
        k => panic!("wrong kind {k:?}"),
    }
}

#[test]
fn tensor_offset_overflows() {
    let e = fail(one_tensor(&[4], 0, !31u64, 16), "tensor 'w'");
    assert!(
        matches!(e.kind(), GgufErrorKind::OffsetOverflow { .. }),
        "{e}"
    );
}

#[test]
fn product_of_dims_overflows() {
    let e = fail(one_tensor(&[1 << 32, 1 << 32], 0, 0, 0), "tensor 'w'");
    assert!(matches!(e.kind(), GgufErrorKind::DimsOverflow { .. }));
    assert!(e.to_string().contains("overflows u64"), "{e}");
}

#[test]
fn byte_size_overflows() {
    // 2^62 elements fit; 2^62 * 4 bytes do not.
    let e = fail(one_tensor(&[1 << 31, 1 << 31], 0, 0, 0), "tensor 'w'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::SizeOverflow {
            ty: GgmlType::F32,
            ..
        }
    ));
}

#[test]
fn too_many_dims() {
    let e = fail(one_tensor(&[1, 1, 1, 1, 1], 0, 0, 4), "tensor 'w'");
    assert!(matches!(e.kind(), GgufErrorKind::TooManyDims { n_dims: 5 }));
    // An absurd n_dims is rejected before reading (or allocating) any dim.
    let raw = Raw::header(3, 1, 0).str("w").u32(u32::MAX).zeros(16);
    let e = fail(raw, "tensor 'w'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::TooManyDims { n_dims: 4294967295 }
    ));
}

#[test]
fn row_not_a_whole_number_of_blocks() {
    let e = fail(one_tensor(&[16], GgmlType::Q8_0.id(), 0, 64), "tensor 'w'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::NotBlockMultiple {
            ne0: 16,
            block_size: 32,
            ..
        }
    ));
}

#[test]
fn unknown_tensor_type() {
    for id in [4u32, 5, 31, 99, u32::MAX] {
        let e = fail(one_tensor(&[4], id, 0, 16), "tensor 'w'");
        assert!(matches!(e.kind(), GgufErrorKind::UnknownTensorType { id: got } if *got == id));
        assert!(
            e.to_string()
                .contains(&format!("unknown tensor type id {id}")),
            "{e}"
        );
    }
}

#[test]
fn misaligned_tensor_offset() {
    let e = fail(one_tensor(&[4], 0, 8, 64), "tensor 'w'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::MisalignedOffset {
            offset: 8,
            alignment: 32
        }
    ));
    // Aligned for 8 once general.alignment says so.
    Raw::header(3, 1, 1)
        .kv_u32("general.alignment", 8)
        .tensor("w", &[4], 0, 8)
        .pad_to(8)
        .zeros(24)
        .parse()
        .expect("aligned to 8");
}

#[test]
fn overlapping_tensors() {
    let raw = Raw::header(3, 2, 0)
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[16], 0, 32)
        .pad_to(32)
        .zeros(128);
    let e = fail(raw, "tensor 'b'");
    assert!(
        matches!(e.kind(), GgufErrorKind::Overlap { other, .. } if other == "a"),
        "{e}"
    );
}

#[test]
fn duplicate_tensor_names() {
    let raw = Raw::header(3, 2, 0)
        .tensor("w", &[4], 0, 0)
        .tensor("w", &[4], 0, 32)
        .pad_to(32)
        .zeros(64);
    let e = fail(raw, "tensor 'w'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::DuplicateTensor { first: 0 }
    ));
}

#[test]
fn duplicate_keys() {
    let raw = Raw::header(3, 0, 3)
        .kv_u32("a", 1)
        .kv_u32("b", 2)
        .kv_u32("a", 3);
    let e = fail(raw, "metadata 'a'");
    assert!(matches!(e.kind(), GgufErrorKind::DuplicateKey { first: 0 }));
}

#[test]
fn strings_must_be_utf8() {
    // In a key.
    let raw = Raw::header(3, 0, 1)
        .u64(2)
        .bytes(&[0xc3, 0x28])
        .u32(GgufValueType::U8.id())
        .u8(0);
    let e = fail(raw, "metadata key #0");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::InvalidUtf8 { offset: 32, .. }
    ));
    // In a value.
    let raw = Raw::header(3, 0, 1)
        .str("name")
        .u32(GgufValueType::String.id())
        .u64(1)
        .u8(0xff);
    let e = fail(raw, "metadata 'name'");
    assert!(matches!(e.kind(), GgufErrorKind::InvalidUtf8 { .. }));
    assert!(e.to_string().contains("not valid UTF-8"), "{e}");
    // In a tensor name.
    let raw = Raw::header(3, 1, 0)
        .u64(1)
        .u8(0x80)
        .u32(1)
        .u64(4)
        .u32(0)
        .u64(0);
    let e = fail(raw, "tensor info #0");
    assert!(matches!(e.kind(), GgufErrorKind::InvalidUtf8 { .. }));
}

#[test]
fn absurd_counts_are_rejected_before_allocating() {
    let e = fail(Raw::header(3, 0, u64::MAX), "metadata count");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::CountTooLarge {
            what: "metadata",
            ..
        }
    ));
    let e = fail(Raw::header(3, u64::MAX, 0), "tensor count");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::CountTooLarge { what: "tensor", .. }
    ));
    assert!(e.to_string().contains("cannot fit"), "{e}");
    // Each count alone fits, together they do not.
    let raw = Raw::header(3, 2, 2).kv_u32("a", 1).kv_u32("b", 2).zeros(10);
    let e = fail(raw, "tensor count");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::CountTooLarge { count: 2, .. }
    ));
}

#[test]
fn absurd_array_lengths_are_rejected_before_allocating() {
    for (elem, len) in [
        (GgufValueType::U8, u64::MAX),
        (GgufValueType::U64, 1 << 61),
        (GgufValueType::String, 1 << 40),
        (GgufValueType::Array, 3),
    ] {
        let raw = Raw::header(3, 0, 1)
            .str("arr")
            .u32(GgufValueType::Array.id())
            .u32(elem.id())
            .u64(len)
            .zeros(16);
        let e = fail(raw, "metadata 'arr'");
        assert!(
            matches!(e.kind(), GgufErrorKind::ArrayTooLong { len: l, .. } if *l == len),
            "{elem}: {e}"
        );
    }
    // An absurd string length is a truncation.
    let raw = Raw::header(3, 0, 1)
        .str("s")
        .u32(GgufValueType::String.id())
        .u64(u64::MAX);
    let e = fail(raw, "metadata 's'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::Truncated {
            needed: u64::MAX,
            ..
        }
    ));
}

#[test]
fn unknown_value_type() {
    let raw = Raw::header(3, 0, 1).str("k").u32(13).u32(0);
    let e = fail(raw, "metadata 'k'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::UnknownValueType { id: 13 }
    ));
    // As an array element type.
    let raw = Raw::header(3, 0, 1)
        .str("k")
        .u32(GgufValueType::Array.id())
        .u32(77)
        .u64(0);
    let e = fail(raw, "metadata 'k'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::UnknownValueType { id: 77 }
    ));
}

#[test]
fn invalid_bool() {
    let raw = Raw::header(3, 0, 1)
        .str("b")
        .u32(GgufValueType::Bool.id())
        .u8(2);
    let e = fail(raw, "metadata 'b'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::InvalidBool { value: 2, .. }
    ));
}

#[test]
fn arrays_nested_too_deep() {
    let mut raw = Raw::header(3, 0, 1)
        .str("deep")
        .u32(GgufValueType::Array.id());
    for _ in 0..MAX_ARRAY_DEPTH + 10 {
        raw = raw.u32(GgufValueType::Array.id()).u64(1);
    }
    raw = raw.u32(GgufValueType::U8.id()).u64(0);
    let e = fail(raw, "metadata 'deep'");
    assert!(
        matches!(e.kind(), GgufErrorKind::NestingTooDeep { .. }),
        "{e}"
    );
}

#[test]
fn bad_alignment_values() {
    for a in [0u32, 3, 48] {
        let raw = Raw::header(3, 0, 1)
            .kv_u32("general.alignment", a)
            .pad_to(32);
        let e = fail(raw, "metadata 'general.alignment'");
        assert!(
            matches!(e.kind(), GgufErrorKind::BadAlignment { value } if *value == u64::from(a))
        );
        assert!(e.to_string().contains("power of two"), "{e}");
    }
    let raw = Raw::header(3, 0, 1)
        .str("general.alignment")
        .u32(GgufValueType::U64.id())
        .u64(32);
    let e = fail(raw, "metadata 'general.alignment'");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::AlignmentType { found: "u64" }
    ));
}

#[test]
fn open_reports_missing_file_with_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("nope.gguf");
    let e = GgufFile::open(&p).expect_err("missing");
    assert!(matches!(e.kind(), GgufErrorKind::Io(_)));
    assert_eq!(e.path(), p.as_path());
    assert!(e.to_string().contains("nope.gguf: file: "), "{e}");
}

#[test]
fn open_reports_bad_file_with_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("model.gguf");
    std::fs::write(&p, b"").expect("write");
    let e = GgufFile::open(&p).expect_err("empty");
    assert!(matches!(e.kind(), GgufErrorKind::Truncated { .. }));
    assert!(
        e.to_string()
            .starts_with(&format!("{}: magic: truncated", p.display())),
        "{e}"
    );
    // A real tensor name in the message, as the model loader will show it.
    let raw = Raw::header(3, 1, 0)
        .tensor("blk.3.attn_q.weight", &[100], 0, 0)
        .pad_to(32)
        .zeros(8);
    std::fs::write(&p, &raw.0).expect("write");
    let e = GgufFile::open(&p).expect_err("short");
    assert!(
        e.to_string()
            .contains("model.gguf: tensor 'blk.3.attn_q.weight': data ends at byte"),
        "{e}"
    );
}

#[test]
fn hand_built_tensor_info_never_panics_in_tensor_data() {
    let f = one_tensor(&[4], 0, 0, 16).parse().expect("valid");
    for t in [
        TensorInfo {
            name: "x".into(),
            dims: vec![u64::MAX],
            ty: GgmlType::F32,
            offset: 0,
        },
        TensorInfo {
            name: "x".into(),
            dims: vec![4],
            ty: GgmlType::F32,
            offset: u64::MAX,
        },
        TensorInfo {
            name: "x".into(),
            dims: vec![5],
            ty: GgmlType::Q8_0,
            offset: 0,
        },
    ] {
        assert!(f.tensor_data(&t).is_empty());
    }
}

//! Unit tests: value round trips, layout, writer behaviour, accessors.

use super::*;
use gemtune_kernels::quant::GgmlType;

type NoErr = std::convert::Infallible;

fn no_tensors(_: usize, _: &TensorInfo, _: &mut [u8]) -> Result<(), NoErr> {
    Ok(())
}

fn roundtrip(w: GgufWriter) -> (Vec<u8>, GgufFile) {
    let bytes = w.write_to_vec(no_tensors).expect("write");
    let f = GgufFile::from_bytes(bytes.clone(), "rt.gguf").expect("read back");
    (bytes, f)
}

/// Compares values bit-exactly (NaN payloads and -0.0 included).
fn same(a: &GgufValue, b: &GgufValue) -> bool {
    match (a, b) {
        (GgufValue::F32(x), GgufValue::F32(y)) => x.to_bits() == y.to_bits(),
        (GgufValue::F64(x), GgufValue::F64(y)) => x.to_bits() == y.to_bits(),
        (GgufValue::Array(x), GgufValue::Array(y)) => {
            x.elem_type == y.elem_type
                && x.values.len() == y.values.len()
                && x.values.iter().zip(&y.values).all(|(p, q)| same(p, q))
        }
        _ => a == b,
    }
}

fn all_scalars() -> Vec<(&'static str, GgufValue)> {
    vec![
        ("u8.min", GgufValue::U8(0)),
        ("u8.max", GgufValue::U8(u8::MAX)),
        ("i8.min", GgufValue::I8(i8::MIN)),
        ("i8.max", GgufValue::I8(i8::MAX)),
        ("u16", GgufValue::U16(u16::MAX)),
        ("i16", GgufValue::I16(i16::MIN)),
        ("u32", GgufValue::U32(u32::MAX)),
        ("i32", GgufValue::I32(i32::MIN)),
        ("f32.pi", GgufValue::F32(std::f32::consts::PI)),
        ("f32.negzero", GgufValue::F32(-0.0)),
        ("f32.nan", GgufValue::F32(f32::from_bits(0x7fc0_1234))),
        ("f32.inf", GgufValue::F32(f32::NEG_INFINITY)),
        ("f32.subnormal", GgufValue::F32(f32::from_bits(1))),
        ("bool.t", GgufValue::Bool(true)),
        ("bool.f", GgufValue::Bool(false)),
        ("string", GgufValue::String("Gemma \u{1F600} \0 nul".into())),
        ("string.empty", GgufValue::String(String::new())),
        ("u64", GgufValue::U64(u64::MAX)),
        ("i64", GgufValue::I64(i64::MIN)),
        ("f64.e", GgufValue::F64(std::f64::consts::E)),
        (
            "f64.nan",
            GgufValue::F64(f64::from_bits(0xfff8_0000_0000_0042)),
        ),
    ]
}

#[test]
fn every_scalar_type_round_trips_bit_exactly() {
    let mut w = GgufWriter::new();
    for (k, v) in all_scalars() {
        w.add_metadata(k, v);
    }
    let (_, f) = roundtrip(w);
    let want = all_scalars();
    assert_eq!(f.metadata().len(), want.len());
    for ((gk, gv), (wk, wv)) in f.metadata().iter().zip(&want) {
        assert_eq!(gk, wk);
        assert!(same(gv, wv), "{wk}: got {gv:?}, want {wv:?}");
    }
    // Every one of the 13 types appears once arrays are included below;
    // here check the 12 scalar ones.
    let types: std::collections::BTreeSet<_> =
        f.metadata().iter().map(|(_, v)| v.value_type()).collect();
    assert_eq!(types.len(), 12);
}

#[test]
fn arrays_of_every_type_round_trip() {
    let mut w = GgufWriter::new();
    for ty in GgufValueType::ALL {
        let values: Vec<GgufValue> = all_scalars()
            .into_iter()
            .map(|(_, v)| v)
            .filter(|v| v.value_type() == ty)
            .collect();
        let values = if ty == GgufValueType::Array {
            vec![GgufValue::array(GgufValueType::U8, [1u8, 2, 3])]
        } else {
            values
        };
        w.add_metadata(format!("arr.{}", ty.name()), GgufValue::array(ty, values));
    }
    w.add_metadata(
        "arr.empty",
        GgufValue::array(GgufValueType::String, Vec::<String>::new()),
    );
    let expected: Vec<(String, GgufValue)> = w.metadata().to_vec();
    let (_, f) = roundtrip(w);
    assert_eq!(f.metadata().len(), expected.len());
    for ((gk, gv), (wk, wv)) in f.metadata().iter().zip(&expected) {
        assert_eq!(gk, wk);
        assert!(same(gv, wv), "{wk}");
    }
    let empty = f.get_array("arr.empty").expect("empty array");
    assert_eq!((empty.elem_type, empty.len()), (GgufValueType::String, 0));
}

#[test]
fn arrays_of_arrays_round_trip() {
    use GgufValueType as T;
    let inner_u32 = GgufValue::array(T::U32, [1u32, 2, 3]);
    let inner_str = GgufValue::array(T::String, ["a", "bc"]);
    let inner_empty = GgufValue::array(T::F64, Vec::<f64>::new());
    let nested = GgufValue::array(
        T::Array,
        [GgufValue::array(
            T::Array,
            [GgufValue::array(T::I8, [-1i8])],
        )],
    );
    let v = GgufValue::array(T::Array, [inner_u32, inner_str, inner_empty, nested]);
    let mut w = GgufWriter::new();
    w.add_metadata("aoa", v.clone());
    let (bytes, f) = roundtrip(w);
    assert!(same(f.get("aoa").expect("aoa"), &v));
    assert_eq!(f.get("aoa").expect("aoa").encoded_len(), v.encoded_len());
    // The header size matches the encoder's own accounting.
    assert_eq!(bytes.len() as u64, f.data_offset());
}

#[test]
fn metadata_order_is_kept_and_replacement_is_in_place() {
    let mut w = GgufWriter::new();
    w.add_metadata("z", GgufValue::U32(1));
    w.add_metadata("a", GgufValue::U32(2));
    w.add_metadata("m", GgufValue::U32(3));
    w.add_metadata("z", GgufValue::String("replaced".into()));
    let (_, f) = roundtrip(w);
    let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["z", "a", "m"]);
    assert_eq!(f.get_str("z"), Some("replaced"));
}

fn three_tensor_writer(alignment: Option<u64>) -> GgufWriter {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w = w.with_alignment(a);
    }
    w.add_metadata("general.architecture", GgufValue::from("gemma4"));
    w.add_tensor("a", vec![3], GgmlType::F32).expect("a");
    w.add_tensor("b", vec![32, 2], GgmlType::Q8_0).expect("b");
    w.add_tensor("c", vec![5, 1, 1, 1], GgmlType::F16)
        .expect("c");
    w
}

/// Fills tensor i with bytes derived from (i, position), never zero.
fn pattern(i: usize, _t: &TensorInfo, dst: &mut [u8]) -> Result<(), NoErr> {
    for (j, b) in dst.iter_mut().enumerate() {
        *b = ((i * 31 + j * 7) % 255 + 1) as u8;
    }
    Ok(())
}

#[test]
fn tensor_layout_default_alignment() {
    let w = three_tensor_writer(None);
    let offsets: Vec<u64> = w.tensor_infos().iter().map(|t| t.offset).collect();
    // a: 12 bytes -> next at 32; b: 68 bytes -> 32 + 68 = 100 -> 128.
    assert_eq!(offsets, [0, 32, 128]);
    let sizes: Vec<u64> = w.tensor_infos().iter().map(TensorInfo::n_bytes).collect();
    assert_eq!(sizes, [12, 68, 10]);
    let total = w.total_file_size();
    let bytes = w.write_to_vec(pattern).expect("write");
    assert_eq!(bytes.len() as u64, total);
    let f = GgufFile::from_bytes(bytes.clone(), "layout.gguf").expect("read");
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.get("general.alignment"), None);
    assert_eq!(f.data_offset() % 32, 0);
    // File ends at the padded end of the last tensor.
    assert_eq!(f.file_len(), f.data_offset() + 160);
    for (i, t) in f.tensors().iter().enumerate() {
        let mut want = vec![0u8; t.n_bytes() as usize];
        pattern(i, t, &mut want).expect("pattern");
        assert_eq!(f.tensor_data(t), want.as_slice(), "tensor {}", t.name);
    }
    // Everything that is not header or tensor data is zero.
    let mut covered = vec![false; bytes.len()];
    let header_end = bytes.len() - (f.file_len() - f.data_offset()) as usize;
    covered[..header_end].iter_mut().for_each(|c| *c = true);
    for t in f.tensors() {
        let s = (f.data_offset() + t.offset) as usize;
        covered[s..s + t.n_bytes() as usize]
            .iter_mut()
            .for_each(|c| *c = true);
    }
    for (i, (&b, &c)) in bytes.iter().zip(&covered).enumerate() {
        if !c {
            assert_eq!(b, 0, "padding byte {i} not zero");
        }
    }
}

#[test]
fn alignment_other_than_32() {
    for a in [1u64, 8, 64, 4096] {
        let w = three_tensor_writer(Some(a));
        let bytes = w.write_to_vec(pattern).expect("write");
        let f = GgufFile::from_bytes(bytes, "align.gguf").expect("read");
        assert_eq!(f.alignment(), a);
        assert_eq!(f.get_u64("general.alignment"), Some(a));
        assert_eq!(f.data_offset() % a, 0);
        let mut next = 0u64;
        for t in f.tensors() {
            assert_eq!(t.offset, next.div_ceil(a) * a, "alignment {a}, {}", t.name);
            next = t.offset + t.n_bytes();
        }
        assert_eq!(f.file_len(), f.data_offset() + next.div_ceil(a) * a);
        // Re-writing reproduces the bytes.
        let again = GgufWriter::from_file(&f)
            .write_to_vec(|i, _t, dst| {
                dst.copy_from_slice(f.tensor_data(&f.tensors()[i]));
                Ok::<(), NoErr>(())
            })
            .expect("rewrite");
        assert!(again.as_slice() == f.as_bytes(), "alignment {a}");
    }
}

#[test]
fn changing_alignment_after_adding_tensors_relays_them_out() {
    let mut w = three_tensor_writer(None);
    w.add_metadata("general.alignment", GgufValue::U32(256));
    let offsets: Vec<u64> = w.tensor_infos().iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [0, 256, 512]);
    let f = GgufFile::from_bytes(w.write_to_vec(pattern).expect("write"), "x").expect("read");
    assert_eq!(f.alignment(), 256);
}

#[test]
fn version_2_files_read_like_version_3() {
    let mut w2 = three_tensor_writer(None);
    w2.set_version(2);
    let b2 = w2.write_to_vec(pattern).expect("v2");
    let b3 = three_tensor_writer(None).write_to_vec(pattern).expect("v3");
    // Same layout: only the version field differs (u64 counts in both).
    assert_eq!(&b2[4..8], &2u32.to_le_bytes());
    assert_eq!(b2.len(), b3.len());
    assert_eq!(b2[..4], b3[..4]);
    assert_eq!(b2[8..], b3[8..]);
    let f2 = GgufFile::from_bytes(b2.clone(), "v2.gguf").expect("read v2");
    assert_eq!(f2.version(), 2);
    assert_eq!(f2.tensors().len(), 3);
    assert_eq!(f2.get_str("general.architecture"), Some("gemma4"));
    // A v2 file copies as v2, byte for byte.
    let again = GgufWriter::from_file(&f2)
        .write_to_vec(|i, _t, dst| {
            dst.copy_from_slice(f2.tensor_data(&f2.tensors()[i]));
            Ok::<(), NoErr>(())
        })
        .expect("rewrite");
    assert!(again == b2);
}

#[test]
fn write_with_streams_to_a_file_and_reads_back_zero_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.gguf");
    let mut w = GgufWriter::new();
    w.add_metadata("k", GgufValue::U64(7));
    // Enough tensors for rayon to actually run fills concurrently.
    for i in 0..64 {
        w.add_tensor(format!("t{i}"), vec![64, (i % 5) as u64 + 1], GgmlType::F32)
            .expect("add");
    }
    let total = w.total_file_size();
    w.write_with(&path, pattern).expect("write_with");
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), total);
    let f = GgufFile::open(&path).expect("open");
    assert_eq!(f.path(), path.as_path());
    let base = f.as_bytes().as_ptr() as usize;
    for (i, t) in f.tensors().iter().enumerate() {
        let data = f.tensor_data(t);
        assert_eq!(
            data.as_ptr() as usize,
            base + (f.data_offset() + t.offset) as usize
        );
        let mut want = vec![0u8; data.len()];
        pattern(i, t, &mut want).expect("pattern");
        assert_eq!(data, want.as_slice());
    }
    assert_eq!(f.tensor_data_by_name("t3").map(<[u8]>::len), Some(256 * 4));
    assert_eq!(f.tensor_data_by_name("missing"), None);
}

#[test]
fn fill_error_names_the_tensor_and_removes_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.gguf");
    let w = three_tensor_writer(None);
    let err = w
        .write_with(&path, |i, _t, _dst| {
            if i >= 1 {
                Err(format!("generator {i} broke"))
            } else {
                Ok(())
            }
        })
        .expect_err("fill fails");
    assert!(matches!(err.kind(), GgufErrorKind::Fill { .. }));
    // Lowest failing index wins, whatever the thread schedule.
    assert_eq!(err.item(), "tensor 'b'");
    let msg = err.to_string();
    assert!(
        msg.contains("bad.gguf") && msg.contains("generator 1 broke"),
        "{msg}"
    );
    assert!(!path.exists());

    // An invalid writer does not touch an existing file at the path.
    std::fs::write(&path, b"precious").expect("write");
    let mut w = GgufWriter::new();
    w.set_version(7);
    let e = w.write_with(&path, no_tensors).expect_err("bad version");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::UnsupportedVersion { version: 7 }
    ));
    assert_eq!(std::fs::read(&path).expect("read"), b"precious");
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    w.add_tensor("x", vec![4], GgmlType::F32).expect("x");
    let e = w.add_tensor("x", vec![4], GgmlType::F32).expect_err("dup");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::DuplicateTensor { first: 0 }
    ));
    assert_eq!(e.item(), "tensor 'x'");
    let e = w
        .add_tensor("y", vec![1, 1, 1, 1, 1], GgmlType::F32)
        .expect_err("5 dims");
    assert!(matches!(e.kind(), GgufErrorKind::TooManyDims { n_dims: 5 }));
    let e = w
        .add_tensor("q", vec![16], GgmlType::Q8_0)
        .expect_err("partial block");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::NotBlockMultiple { ne0: 16, .. }
    ));
    let e = w
        .add_tensor("o", vec![1 << 31, 1 << 31], GgmlType::F32)
        .expect_err("overflow");
    assert!(
        matches!(e.kind(), GgufErrorKind::SizeOverflow { .. }),
        "{e}"
    );
    let e = w
        .add_tensor("p", vec![u64::MAX, 2], GgmlType::F32)
        .expect_err("overflow");
    assert!(
        matches!(e.kind(), GgufErrorKind::DimsOverflow { .. }),
        "{e}"
    );
    assert_eq!(w.tensor_infos().len(), 1);
}

#[test]
fn writer_rejects_bad_settings_at_write_time() {
    let mut w = GgufWriter::new();
    w.set_version(1);
    let e = w.write_to_vec(no_tensors).expect_err("v1");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::UnsupportedVersion { version: 1 }
    ));

    for a in [0u64, 3, 1 << 33] {
        let mut w = GgufWriter::new().with_alignment(a);
        let e = w
            .add_tensor("t", vec![1], GgmlType::F32)
            .expect_err("bad alignment");
        assert!(
            matches!(e.kind(), GgufErrorKind::BadAlignment { .. }),
            "{a}: {e}"
        );
        let e = w.write_to_vec(no_tensors).expect_err("bad alignment");
        assert!(
            matches!(e.kind(), GgufErrorKind::BadAlignment { .. }),
            "{a}: {e}"
        );
        assert_eq!(e.item(), "metadata 'general.alignment'");
    }

    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", GgufValue::U64(64));
    let e = w.write_to_vec(no_tensors).expect_err("u64 alignment");
    assert!(matches!(
        e.kind(),
        GgufErrorKind::AlignmentType { found: "u64" }
    ));

    let mut w = GgufWriter::new();
    w.add_metadata(
        "mixed",
        GgufValue::Array(GgufArray {
            elem_type: GgufValueType::U32,
            values: vec![GgufValue::U32(1), GgufValue::F32(2.0)],
        }),
    );
    let e = w.write_to_vec(no_tensors).expect_err("mixed array");
    assert!(matches!(e.kind(), GgufErrorKind::InvalidValue { .. }));
    assert_eq!(
        e.to_string(),
        "<memory>: metadata 'mixed': invalid value: array element 1 is f32 but the array holds u32"
    );

    let mut deep = GgufValue::array(GgufValueType::U8, [1u8]);
    for _ in 0..MAX_ARRAY_DEPTH {
        deep = GgufValue::array(GgufValueType::Array, [deep]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", deep);
    let e = w.write_to_vec(no_tensors).expect_err("too deep");
    assert!(e.to_string().contains("nest more than"), "{e}");
}

#[test]
fn deepest_allowed_nesting_round_trips() {
    let mut v = GgufValue::array(GgufValueType::U8, [1u8]);
    for _ in 1..MAX_ARRAY_DEPTH {
        v = GgufValue::array(GgufValueType::Array, [v]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", v.clone());
    let (_, f) = roundtrip(w);
    assert_eq!(f.get("deep"), Some(&v));
}

#[test]
fn empty_file_and_zero_sized_tensors() {
    let (bytes, f) = roundtrip(GgufWriter::new());
    assert_eq!(bytes.len(), 32); // 24-byte header padded to 32
    assert_eq!((f.metadata().len(), f.tensors().len()), (0, 0));

    let mut w = GgufWriter::new();
    w.add_tensor("empty", vec![0, 4], GgmlType::F32)
        .expect("empty");
    w.add_tensor("one", vec![1], GgmlType::F32).expect("one");
    let f = GgufFile::from_bytes(w.write_to_vec(pattern).expect("write"), "z").expect("read");
    let e = f.tensor("empty").expect("empty");
    assert_eq!(
        (e.n_elements(), e.n_bytes(), f.tensor_data(e).len()),
        (0, 0, 0)
    );
    assert_eq!(f.tensor("one").map(|t| t.offset), Some(0));
}

#[test]
fn value_accessors() {
    use GgufValue as V;
    assert_eq!(V::U8(5).as_u64(), Some(5));
    assert_eq!(V::I32(7).as_u64(), Some(7));
    assert_eq!(V::I32(-7).as_u64(), None);
    assert_eq!(V::I64(-7).as_i64(), Some(-7));
    assert_eq!(V::U64(u64::MAX).as_i64(), None);
    assert_eq!(V::U64(u64::MAX).as_u64(), Some(u64::MAX));
    assert_eq!(V::Bool(true).as_u64(), None);
    assert_eq!(V::F32(1.0).as_u64(), None);
    assert_eq!(V::F32(1.5).as_f32(), Some(1.5));
    assert_eq!(V::F64(0.1).as_f32(), Some(0.1f32));
    assert_eq!(V::U32(1).as_f32(), None);
    assert_eq!(V::F32(0.1).as_f64(), Some(f64::from(0.1f32)));
    assert_eq!(V::Bool(false).as_bool(), Some(false));
    assert_eq!(V::U8(0).as_bool(), None);
    assert_eq!(V::from("s").as_str(), Some("s"));
    assert_eq!(V::U8(0).as_str(), None);
    let a = V::array(GgufValueType::I16, [-1i16, 2]);
    let arr = a.as_array().expect("array");
    assert_eq!(arr.to_i64_vec(), Some(vec![-1, 2]));
    assert_eq!(arr.to_u64_vec(), None);
    assert_eq!(V::U8(0).as_array(), None);
    assert_eq!(
        V::array(GgufValueType::F32, [1.0f32, 2.0])
            .as_array()
            .and_then(GgufArray::to_f32_vec),
        Some(vec![1.0, 2.0])
    );
    assert_eq!(
        V::array(GgufValueType::Bool, [true])
            .as_array()
            .and_then(GgufArray::to_bool_vec),
        Some(vec![true])
    );
    let names: Vec<&str> = [
        V::U8(0),
        V::I8(0),
        V::U16(0),
        V::I16(0),
        V::U32(0),
        V::I32(0),
        V::F32(0.0),
        V::Bool(false),
        V::String(String::new()),
        a.clone(),
        V::U64(0),
        V::I64(0),
        V::F64(0.0),
    ]
    .iter()
    .map(GgufValue::type_name)
    .collect();
    assert_eq!(
        names,
        [
            "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64",
            "f64"
        ]
    );
    for (i, ty) in GgufValueType::ALL.iter().enumerate() {
        assert_eq!(ty.id(), i as u32);
        assert_eq!(GgufValueType::from_id(i as u32), Some(*ty));
    }
    assert_eq!(GgufValueType::from_id(13), None);
    assert_eq!(a.to_string(), "[i16; 2]");
}

#[test]
fn file_accessors() {
    let mut w = GgufWriter::new();
    w.add_metadata("n", GgufValue::U64(1 << 40));
    w.add_metadata("small", GgufValue::I16(12));
    w.add_metadata("neg", GgufValue::I32(-3));
    w.add_metadata("eps", GgufValue::F32(1e-6));
    w.add_metadata("flag", GgufValue::Bool(true));
    w.add_metadata("name", GgufValue::from("tiny"));
    w.add_metadata("heads", GgufValue::array(GgufValueType::I32, [2i32, 2, 1]));
    let (_, f) = roundtrip(w);
    assert_eq!(f.get_u64("n"), Some(1 << 40));
    assert_eq!(f.get_u32("n"), None); // does not fit
    assert_eq!(f.get_u32("small"), Some(12));
    assert_eq!(f.get_u64("neg"), None);
    assert_eq!(f.get_i64("neg"), Some(-3));
    assert_eq!(f.get_f32("eps"), Some(1e-6));
    assert_eq!(f.get_f32("n"), None);
    assert_eq!(f.get_bool("flag"), Some(true));
    assert_eq!(f.get_str("name"), Some("tiny"));
    assert_eq!(f.get_str("missing"), None);
    assert_eq!(
        f.get_array("heads").and_then(GgufArray::to_u64_vec),
        Some(vec![2, 2, 1])
    );
    assert_eq!(f.path(), std::path::Path::new("rt.gguf"));
}

#[test]
fn tensor_info_sizes() {
    let t = |dims: Vec<u64>, ty| TensorInfo {
        name: "t".into(),
        dims,
        ty,
        offset: 0,
    };
    assert_eq!(t(vec![256, 3], GgmlType::Q6K).n_bytes(), 3 * 210);
    assert_eq!(t(vec![64, 2, 3], GgmlType::Q4_0).n_bytes(), 2 * 18 * 6);
    assert_eq!(t(vec![7], GgmlType::Bf16).n_elements(), 7);
    assert_eq!(t(vec![], GgmlType::F32).n_bytes(), 4);
    assert_eq!(t(vec![16], GgmlType::Q8_0).checked_n_bytes(), None);
    assert_eq!(
        t(vec![u64::MAX, 2], GgmlType::F32).checked_n_elements(),
        None
    );
    // A hand-built info that does not describe this file gives an empty slice.
    let (_, f) = roundtrip(three_tensor_writer(None));
    let mut bogus = f.tensors()[0].clone();
    bogus.offset = 1 << 40;
    assert!(f.tensor_data(&bogus).is_empty());
}

#[test]
fn file_and_writer_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
    assert_send_sync::<GgufWriter>();
    assert_send_sync::<GgufError>();
}

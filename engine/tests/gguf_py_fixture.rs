//! Loads a GGUF file written by llama.cpp's gguf-py (0.19.0) and checks
//! every value exactly. The fixture is committed; it was produced by
//! scripts/make-gguf-py-fixture.py, which documents each value.

use std::path::{Path, PathBuf};

use gemtune_engine::gguf::{GgufArray, GgufFile, GgufValue, GgufValueType, GgufWriter};
use gemtune_kernels::quant::GgmlType;

fn fixture_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf-py/small.gguf")
}

fn open() -> GgufFile {
    let p = fixture_path();
    GgufFile::open(&p).unwrap_or_else(|e| panic!("fixture must load: {e}"))
}

fn arr(elem_type: GgufValueType, values: Vec<GgufValue>) -> GgufValue {
    GgufValue::Array(GgufArray { elem_type, values })
}

#[test]
fn header_fields() {
    let f = open();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.metadata().len(), 25);
    assert_eq!(f.tensors().len(), 4);
    assert_eq!(f.path(), fixture_path().as_path());
}

#[test]
fn every_metadata_value_in_file_order() {
    use GgufValue as V;
    use GgufValueType as T;
    let f = open();
    let expected: Vec<(&str, GgufValue)> = vec![
        ("general.architecture", V::String("gemtune-test".into())),
        ("general.name", V::String("gguf-py fixture".into())),
        ("test.u8", V::U8(200)),
        ("test.i8", V::I8(-100)),
        ("test.u16", V::U16(60000)),
        ("test.i16", V::I16(-30000)),
        ("test.u32", V::U32(4_000_000_000)),
        ("test.i32", V::I32(-2_000_000_000)),
        ("test.f32", V::F32(1.1)),
        ("test.u64", V::U64((1u64 << 63) + 12345)),
        ("test.i64", V::I64(-(1i64 << 62) - 7)),
        ("test.f64", V::F64(-1234.5678901234567)),
        ("test.bool_true", V::Bool(true)),
        ("test.bool_false", V::Bool(false)),
        (
            "test.string",
            V::String("h\u{e9}llo w\u{f6}rld \u{2713}".into()),
        ),
        ("test.empty_string", V::String(String::new())),
        (
            "test.array_i32",
            arr(T::I32, vec![V::I32(1), V::I32(-2), V::I32(3)]),
        ),
        (
            "test.array_u8",
            arr(T::U8, vec![V::U8(0), V::U8(127), V::U8(255)]),
        ),
        (
            "test.array_i16",
            arr(T::I16, vec![V::I16(-32768), V::I16(0), V::I16(32767)]),
        ),
        (
            "test.array_u64",
            arr(T::U64, vec![V::U64(0), V::U64(u64::MAX)]),
        ),
        (
            "test.array_f32",
            arr(T::F32, vec![V::F32(0.5), V::F32(-1.25), V::F32(1e-3)]),
        ),
        (
            "test.array_f64",
            arr(T::F64, vec![V::F64(1.0 / 3.0), V::F64(-0.0)]),
        ),
        (
            "test.array_bool",
            arr(T::Bool, vec![V::Bool(true), V::Bool(false), V::Bool(true)]),
        ),
        (
            "test.array_str",
            arr(
                T::String,
                vec![
                    V::String("a".into()),
                    V::String(String::new()),
                    V::String("\u{fc}\u{df}".into()),
                    V::String("<start_of_turn>".into()),
                ],
            ),
        ),
        (
            "test.array_of_arrays",
            arr(
                T::Array,
                vec![
                    arr(T::I32, vec![V::I32(1), V::I32(2)]),
                    arr(T::I32, vec![V::I32(3)]),
                    arr(
                        T::String,
                        vec![V::String("x".into()), V::String("yz".into())],
                    ),
                    arr(
                        T::Array,
                        vec![
                            arr(T::F32, vec![V::F32(0.5)]),
                            arr(T::F32, vec![V::F32(1.5), V::F32(2.5)]),
                        ],
                    ),
                ],
            ),
        ),
    ];
    let got: Vec<(&str, &GgufValue)> = f.metadata().iter().map(|(k, v)| (k.as_str(), v)).collect();
    assert_eq!(got.len(), expected.len());
    for ((gk, gv), (ek, ev)) in got.iter().zip(&expected) {
        assert_eq!(gk, ek);
        assert_eq!(*gv, ev, "value of {ek}");
    }
    // PartialEq treats -0.0 == 0.0; pin the sign bit separately.
    let f64s = f.get_array("test.array_f64").expect("array_f64");
    assert_eq!(
        f64s.values[1].as_f64().map(f64::to_bits),
        Some((-0.0f64).to_bits())
    );
    // Accessors on real data.
    assert_eq!(f.get_str("general.architecture"), Some("gemtune-test"));
    assert_eq!(f.get_u64("test.u32"), Some(4_000_000_000));
    assert_eq!(f.get_i64("test.i8"), Some(-100));
    assert_eq!(f.get_u64("test.i8"), None);
    assert_eq!(f.get_f32("test.f64"), Some(-1234.5678901234567f64 as f32));
    assert_eq!(f.get_bool("test.bool_true"), Some(true));
    assert_eq!(
        f.get_array("test.array_str")
            .and_then(GgufArray::to_str_vec),
        Some(vec!["a", "", "\u{fc}\u{df}", "<start_of_turn>"])
    );
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn tensors_infos_and_data() {
    let f = open();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["f32.matrix", "f32.cube", "f16.vector", "q8_0.matrix"]
    );

    let m = f.tensor("f32.matrix").expect("f32.matrix");
    assert_eq!(
        (m.dims.as_slice(), m.ty, m.offset),
        (&[3u64, 2][..], GgmlType::F32, 0)
    );
    assert_eq!((m.n_elements(), m.n_bytes()), (6, 24));
    let v = f32s(f.tensor_data(m));
    assert_eq!(v, [1.5, -2.0, 0.25, 1e-3, 65504.0, -0.0]);
    assert!(v[5].is_sign_negative());

    let c = f.tensor("f32.cube").expect("f32.cube");
    assert_eq!(
        (c.dims.as_slice(), c.ty, c.offset),
        (&[4u64, 1, 2][..], GgmlType::F32, 32)
    );
    let expect: Vec<f32> = (0..8).map(|i| i as f32 / 8.0).collect();
    assert_eq!(f32s(f.tensor_data(c)), expect);

    let h = f.tensor("f16.vector").expect("f16.vector");
    assert_eq!(
        (h.dims.as_slice(), h.ty, h.offset),
        (&[5u64][..], GgmlType::F16, 64)
    );
    let hv: Vec<f32> = f
        .tensor_data(h)
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    assert_eq!(hv, [1.0, -2.5, 0.099975586, 65504.0, 0.0]);

    let q = f.tensor("q8_0.matrix").expect("q8_0.matrix");
    assert_eq!(
        (q.dims.as_slice(), q.ty, q.offset),
        (&[32u64, 2][..], GgmlType::Q8_0, 96)
    );
    let qd = f.tensor_data(q);
    assert_eq!(qd.len(), 68);
    let block = |b: &[u8]| -> (f32, Vec<i8>) {
        let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        (d, b[2..34].iter().map(|&x| x as i8).collect())
    };
    let (d0, q0) = block(&qd[..34]);
    assert_eq!(d0, 0.5);
    assert_eq!(q0, (-16..16).collect::<Vec<i8>>());
    let (d1, q1) = block(&qd[34..]);
    assert_eq!(d1, 0.03125);
    let mut e1 = vec![0i8; 32];
    (e1[0], e1[1], e1[31]) = (127, -128, 1);
    assert_eq!(q1, e1);
    // Dequantized: 0.5 * -16 = -8 for the first element of row 0.
    assert_eq!(d0 * f32::from(q0[0]), -8.0);

    // Data section runs to the padded end of the last tensor.
    assert_eq!(f.file_len(), f.data_offset() + 96 + 96);
}

#[test]
fn rewrite_is_byte_identical() {
    let f = open();
    let original = std::fs::read(fixture_path()).expect("read fixture");
    let copy = GgufWriter::from_file(&f)
        .write_to_vec(|i, _t, dst| {
            dst.copy_from_slice(f.tensor_data(&f.tensors()[i]));
            Ok::<(), String>(())
        })
        .expect("rewrite");
    assert_eq!(copy.len(), original.len());
    assert!(
        copy == original,
        "rewritten bytes differ from the gguf-py file"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("copy.gguf");
    gemtune_engine::gguf::copy_file(&f, &out).expect("copy_file");
    assert!(std::fs::read(&out).expect("read copy") == original);
}

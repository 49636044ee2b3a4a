#!/usr/bin/env python3
"""Writes engine/tests/fixtures/gguf-py/small.gguf with llama.cpp's gguf-py.

The file exercises every metadata value type (including an array of arrays,
which gguf-py's writer encodes natively), and four small tensors (F32 2-D and
3-D, F16, Q8_0 from raw bytes built here) with known values. The Rust test
engine/tests/gguf_py_fixture.rs checks every value exactly, so any change here
must be mirrored there.

Usage: pip install gguf==0.19.0 numpy
       python3 scripts/make-gguf-py-fixture.py [OUT.gguf]

The output is deterministic: gguf-py writes nothing time- or host-dependent.
"""

import importlib.metadata
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType, GGUFValueType


def q8_0_block(scale: float, qs: list[int]) -> bytes:
    """One Q8_0 block: f16 scale (little-endian) then 32 signed bytes."""
    assert len(qs) == 32
    return struct.pack("<e", scale) + struct.pack("<32b", *qs)


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    default_out = root / "engine" / "tests" / "fixtures" / "gguf-py" / "small.gguf"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default_out
    out.parent.mkdir(parents=True, exist_ok=True)

    w = gguf.GGUFWriter(str(out), arch="gemtune-test")  # adds general.architecture
    w.add_name("gguf-py fixture")  # general.name
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_float32("test.f32", 1.1)  # rounds to the nearest f32
    w.add_uint64("test.u64", 2**63 + 12345)
    w.add_int64("test.i64", -(2**62) - 7)
    w.add_float64("test.f64", -1234.5678901234567)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "h\u00e9llo w\u00f6rld \u2713")
    # add_string drops empty strings; add_key_value keeps them.
    w.add_key_value("test.empty_string", "", GGUFValueType.STRING)
    w.add_array("test.array_i32", [1, -2, 3])  # ints default to INT32
    w.add_key_value("test.array_u8", [0, 127, 255], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT8)
    w.add_key_value("test.array_i16", [-32768, 0, 32767], GGUFValueType.ARRAY, sub_type=GGUFValueType.INT16)
    w.add_key_value("test.array_u64", [0, 2**64 - 1], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT64)
    w.add_array("test.array_f32", [0.5, -1.25, 1e-3])
    w.add_key_value("test.array_f64", [1.0 / 3.0, -0.0], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT64)
    w.add_array("test.array_bool", [True, False, True])
    w.add_array("test.array_str", ["a", "", "\u00fc\u00df", "<start_of_turn>"])
    # Array of arrays: gguf-py types each inner array from its first element.
    w.add_array("test.array_of_arrays", [[1, 2], [3], ["x", "yz"], [[0.5], [1.5, 2.5]]])

    # F32 2-D: numpy shape (2, 3) -> ggml dims [3, 2].
    f32 = np.array([[1.5, -2.0, 0.25], [1e-3, 65504.0, -0.0]], dtype=np.float32)
    w.add_tensor("f32.matrix", f32)
    # F32 3-D: numpy shape (2, 1, 4) -> ggml dims [4, 1, 2]; values 0..7 / 8.
    w.add_tensor("f32.cube", (np.arange(8, dtype=np.float32) / 8.0).reshape(2, 1, 4))
    # F16 1-D, all exactly representable.
    w.add_tensor("f16.vector", np.array([1.0, -2.5, 0.0999755859375, 65504.0, 0.0], dtype=np.float16))
    # Q8_0: 2 rows of one block each, raw bytes (shape in bytes, converted by gguf-py).
    row0 = q8_0_block(0.5, list(range(-16, 16)))
    row1 = q8_0_block(0.03125, [127, -128] + [0] * 29 + [1])
    q8 = np.frombuffer(row0 + row1, dtype=np.uint8).reshape(2, 34)
    w.add_tensor("q8_0.matrix", q8, raw_dtype=GGMLQuantizationType.Q8_0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = out.stat().st_size
    assert size < 50_000, size
    print(f"wrote {out} ({size} bytes) with gguf-py {importlib.metadata.version('gguf')}")


if __name__ == "__main__":
    main()

//! Building small GGUF files in memory for the tests.
#![allow(dead_code)]

use gguf::{Builder, GgmlType, Metadata, TensorSpec, Value, ValueType};

/// A small file with every metadata value type, nested arrays, and a few
/// tensors of different types. Returns the bytes.
pub fn sample_file() -> Vec<u8> {
    let mut m = Metadata::new();
    m.set("general.architecture", Value::String("llama".into()));
    m.set("general.name", Value::String("tiny ✓ test".into()));
    m.set("t.u8", Value::U8(200));
    m.set("t.i8", Value::I8(-100));
    m.set("t.u16", Value::U16(60000));
    m.set("t.i16", Value::I16(-30000));
    m.set("t.u32", Value::U32(4_000_000_000));
    m.set("t.i32", Value::I32(-2_000_000_000));
    m.set("t.f32", Value::F32(1.5));
    m.set("t.bool", Value::Bool(true));
    m.set("t.u64", Value::U64(u64::MAX));
    m.set("t.i64", Value::I64(i64::MIN));
    m.set("t.f64", Value::F64(-2.25));
    m.set(
        "t.strings",
        Value::Array(
            ValueType::String,
            vec![Value::String("a".into()), Value::String("".into())],
        ),
    );
    m.set("t.empty", Value::Array(ValueType::I32, vec![]));
    m.set(
        "t.nested",
        Value::Array(
            ValueType::Array,
            vec![
                Value::Array(ValueType::U8, vec![Value::U8(1), Value::U8(2)]),
                Value::Array(ValueType::F32, vec![Value::F32(0.5)]),
            ],
        ),
    );
    let mut b = Builder::new(m);
    let specs = [
        ("a.weight", vec![32u64, 3], GgmlType::Q4_0),
        ("b.weight", vec![5u64], GgmlType::F32),
        ("c.weight", vec![256u64, 2], GgmlType::Q4_K),
        ("d.weight", vec![7u64, 1, 1, 2], GgmlType::F16),
    ];
    for (name, dims, ty) in specs {
        b.add_tensor(TensorSpec {
            name: name.into(),
            dims,
            ty,
        })
        .unwrap();
    }
    let mut w = b.write_header(Vec::new()).unwrap();
    let mut fill = 1u8;
    while let Some(spec) = w.next_spec() {
        let n = spec.n_bytes().unwrap() as usize;
        let data: Vec<u8> = (0..n)
            .map(|i| fill.wrapping_mul(31).wrapping_add(i as u8))
            .collect();
        w.write_tensor(&data).unwrap();
        fill += 1;
    }
    w.finish().unwrap()
}

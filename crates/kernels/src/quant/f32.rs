//! F32: plain little-endian floats, dotted against F32 activations.

use crate::isa::Isa;
use crate::traits::{TypeTraits, VecDotFn};
use gguf::GgmlType;

pub const TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::F32,
    vec_dot_type: GgmlType::F32,
    to_float,
    from_float,
    vec_dot_ref,
    vec_dot_for,
};

fn to_float(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 4);
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

fn from_float(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len() * 4);
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

fn vec_dot_ref(w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)) {
        let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        sum += (x * y) as f64;
    }
    sum as f32
}

fn vec_dot_for(_isa: Isa) -> VecDotFn {
    vec_dot_ref
}

//! The KV cache: every layer's keys and values for every position of the
//! context, preallocated, in f16 (default), Q8_0 (`--cache-type q8_0`,
//! about half the bytes, as llama.cpp's `-ctk/-ctv q8_0`) or f32 (twice the
//! bytes; what llama.cpp's reference logits were made with).
//!
//! Layout: `(n_layers, n_ctx, n_kv_heads, head_bytes)` for keys and the same
//! for values, so one position's heads are adjacent and one head's
//! positions are a fixed stride apart. A head is stored as whole blocks of
//! the cache type, which is why Q8_0 needs `head_dim` to be a multiple of 32.
//! Rows are written once from f32 and read back widened to f32 one head at
//! a time; attention computes in f32.

use crate::Error;
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use half::f16;
use kernels::quant::f16::{f16_to_f32_row, f32_to_f16_row};
use kernels::traits::traits;
use std::fmt;
use std::str::FromStr;

/// Element type of the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    F32,
}

impl KvType {
    pub const NAMES: [&'static str; 3] = ["f16", "q8_0", "f32"];

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::F32 => "f32",
        }
    }

    pub fn ggml_type(self) -> GgmlType {
        match self {
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::F32 => GgmlType::F32,
        }
    }

    /// Bytes of one head of `head_dim` elements (None if it is not a whole
    /// number of blocks).
    pub fn head_bytes(self, head_dim: usize) -> Option<usize> {
        let ty = self.ggml_type();
        head_dim
            .is_multiple_of(ty.block_size())
            .then(|| head_dim / ty.block_size() * ty.type_size())
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "f32" => Ok(KvType::F32),
            _ => Err(format!(
                "unknown cache type `{s}` (supported: {})",
                KvType::NAMES.join(", ")
            )),
        }
    }
}

/// Eight bytes, so the block casts of the stored rows are aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Word([u8; 8]);

/// Conversions between a stored head and f32: the traits table's, except
/// for f16, whose row converters use F16C/NEON where the CPU has them (the
/// table holds the scalar reference).
#[derive(Clone, Copy)]
struct Codec {
    to_f32: fn(&[u8], &mut [f32]),
    from_f32: fn(&[f32], &mut [u8]),
}

fn f16_widen(src: &[u8], dst: &mut [f32]) {
    f16_to_f32_row(bytemuck::cast_slice::<u8, f16>(src), dst)
}

fn f16_narrow(src: &[f32], dst: &mut [u8]) {
    f32_to_f16_row(src, bytemuck::cast_slice_mut::<u8, f16>(dst))
}

impl Codec {
    fn for_type(ty: KvType) -> Codec {
        match ty {
            KvType::F16 => Codec {
                to_f32: f16_widen,
                from_f32: f16_narrow,
            },
            _ => {
                let tr = traits(ty.ggml_type()).expect("the kernels support q8_0 and f32");
                Codec {
                    to_f32: tr.to_float,
                    from_f32: tr.from_float,
                }
            }
        }
    }
}

pub struct KvCache {
    ty: KvType,
    codec: Codec,
    n_ctx: usize,
    n_kv_heads: usize,
    head_dim: usize,
    head_bytes: usize,
    keys: Vec<Word>,
    values: Vec<Word>,
}

impl KvCache {
    pub fn new(
        ty: KvType,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<KvCache, Error> {
        let head_bytes = ty.head_bytes(head_dim).ok_or_else(|| Error::BadValue {
            key: "cache type".into(),
            problem: format!(
                "{ty} stores blocks of {} values, and the head size {head_dim} is not a multiple of that",
                ty.ggml_type().block_size()
            ),
        })?;
        let bytes = Self::bytes_for(ty, n_layers, n_ctx, n_kv_heads, head_dim).unwrap_or(0) / 2;
        let words = (bytes as usize).div_ceil(8);
        Ok(KvCache {
            ty,
            codec: Codec::for_type(ty),
            n_ctx,
            n_kv_heads,
            head_dim,
            head_bytes,
            keys: vec![Word::zeroed(); words],
            values: vec![Word::zeroed(); words],
        })
    }

    /// Bytes of keys plus values for this shape (None: head size not a whole
    /// number of blocks).
    pub fn bytes_for(
        ty: KvType,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Option<u64> {
        let hb = ty.head_bytes(head_dim)? as u64;
        Some(2 * n_layers as u64 * n_ctx as u64 * n_kv_heads as u64 * hb)
    }

    pub fn ty(&self) -> KvType {
        self.ty
    }

    /// Bytes held (keys and values).
    pub fn bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * 8
    }

    fn row_bytes(&self) -> usize {
        self.n_kv_heads * self.head_bytes
    }

    fn row_range(&self, layer: usize, pos: usize) -> std::ops::Range<usize> {
        assert!(
            pos < self.n_ctx,
            "KV cache: position {pos} ≥ n_ctx {}",
            self.n_ctx
        );
        let start = (layer * self.n_ctx + pos) * self.row_bytes();
        start..start + self.row_bytes()
    }

    /// Store one position's keys and values, `(n_kv_heads · head_dim,)` each.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let r = self.row_range(layer, pos);
        let (hd, hb) = (self.head_dim, self.head_bytes);
        let from_float = self.codec.from_f32;
        for (buf, x) in [(&mut self.keys, k), (&mut self.values, v)] {
            let row = &mut bytemuck::cast_slice_mut::<Word, u8>(buf)[r.clone()];
            for (dst, src) in row.chunks_exact_mut(hb).zip(x.chunks_exact(hd)) {
                from_float(src, dst);
            }
        }
    }

    /// A reader for one layer's cached heads.
    pub fn layer(&self, layer: usize) -> LayerKv<'_> {
        let len = self.n_ctx * self.row_bytes();
        let start = layer * len;
        LayerKv {
            keys: &bytemuck::cast_slice::<Word, u8>(&self.keys)[start..start + len],
            values: &bytemuck::cast_slice::<Word, u8>(&self.values)[start..start + len],
            row_bytes: self.row_bytes(),
            head_bytes: self.head_bytes,
            to_f32: self.codec.to_f32,
        }
    }
}

/// One layer of the cache, shareable across the attention threads.
#[derive(Clone, Copy)]
pub struct LayerKv<'a> {
    keys: &'a [u8],
    values: &'a [u8],
    row_bytes: usize,
    head_bytes: usize,
    to_f32: fn(&[u8], &mut [f32]),
}

impl LayerKv<'_> {
    fn head<'b>(&self, buf: &'b [u8], pos: usize, kv_head: usize) -> &'b [u8] {
        let start = pos * self.row_bytes + kv_head * self.head_bytes;
        &buf[start..start + self.head_bytes]
    }

    /// Keys of every kv head at `positions`, widened into `out`
    /// `(positions.len(), n_kv_heads · head_dim)`: one conversion call for
    /// the whole block, since a layer's positions are contiguous.
    pub fn widen_keys(&self, positions: std::ops::Range<usize>, out: &mut [f32]) {
        let r = positions.start * self.row_bytes..positions.end * self.row_bytes;
        (self.to_f32)(&self.keys[r], out);
    }

    /// Values, as [`LayerKv::widen_keys`].
    pub fn widen_values(&self, positions: std::ops::Range<usize>, out: &mut [f32]) {
        let r = positions.start * self.row_bytes..positions.end * self.row_bytes;
        (self.to_f32)(&self.values[r], out);
    }

    /// Key of `kv_head` at `pos`, widened into `out` `(head_dim,)`.
    pub fn key(&self, pos: usize, kv_head: usize, out: &mut [f32]) {
        (self.to_f32)(self.head(self.keys, pos, kv_head), out);
    }

    /// Value of `kv_head` at `pos`, widened into `out` `(head_dim,)`.
    pub fn value(&self, pos: usize, kv_head: usize, out: &mut [f32]) {
        (self.to_f32)(self.head(self.values, pos, kv_head), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_sizes() {
        assert_eq!("q8_0".parse::<KvType>(), Ok(KvType::Q8_0));
        assert_eq!("F16".parse::<KvType>(), Ok(KvType::F16));
        let e = "q4_0".parse::<KvType>().unwrap_err();
        assert!(e.contains("f16, q8_0, f32"), "{e}");
        assert_eq!(KvType::F16.head_bytes(64), Some(128));
        assert_eq!(KvType::Q8_0.head_bytes(64), Some(68));
        assert_eq!(KvType::Q8_0.head_bytes(18), None);
        assert!(KvCache::new(KvType::Q8_0, 1, 4, 1, 18).is_err());
    }

    #[test]
    fn store_and_read_back() {
        for ty in [KvType::F16, KvType::Q8_0, KvType::F32] {
            let (layers, ctx, heads, hd) = (2, 5, 3, 64);
            let mut c = KvCache::new(ty, layers, ctx, heads, hd).unwrap();
            assert_eq!(
                c.bytes() as u64,
                KvCache::bytes_for(ty, layers, ctx, heads, hd).unwrap()
            );
            let val = |l: usize, p: usize, i: usize, s: f32| {
                s * ((l * 7 + p * 3 + i) % 11) as f32 / 11.0 - 0.4
            };
            for l in 0..layers {
                for p in 0..ctx {
                    let k: Vec<f32> = (0..heads * hd).map(|i| val(l, p, i, 1.0)).collect();
                    let v: Vec<f32> = (0..heads * hd).map(|i| val(l, p, i, -2.0)).collect();
                    c.store(l, p, &k, &v);
                }
            }
            let tol = match ty {
                KvType::F32 => 1e-7,
                KvType::F16 => 1e-3,
                KvType::Q8_0 => 2e-2,
            };
            let mut out = vec![0.0; hd];
            for l in 0..layers {
                let kv = c.layer(l);
                for p in 0..ctx {
                    for h in 0..heads {
                        kv.key(p, h, &mut out);
                        for (i, &o) in out.iter().enumerate() {
                            assert!((o - val(l, p, h * hd + i, 1.0)).abs() < tol, "{ty} key");
                        }
                        kv.value(p, h, &mut out);
                        for (i, &o) in out.iter().enumerate() {
                            assert!(
                                (o - val(l, p, h * hd + i, -2.0)).abs() < 2.0 * tol,
                                "{ty} value"
                            );
                        }
                    }
                }
                // Widening a block of positions gives the same rows.
                let (mut wk, mut wv) = (vec![0.0; 3 * heads * hd], vec![0.0; 3 * heads * hd]);
                kv.widen_keys(1..4, &mut wk);
                kv.widen_values(1..4, &mut wv);
                for p in 1..4 {
                    for h in 0..heads {
                        let at = (p - 1) * heads * hd + h * hd;
                        kv.key(p, h, &mut out);
                        assert_eq!(&wk[at..at + hd], &out[..], "{ty}");
                        kv.value(p, h, &mut out);
                        assert_eq!(&wv[at..at + hd], &out[..], "{ty}");
                    }
                }
            }
        }
    }
}

//! The KV cache: every layer's keys and values for every position of the
//! context, preallocated, in f16 (default), Q8_0 (`--cache-type q8_0`,
//! about half the bytes, as llama.cpp's `-ctk/-ctv q8_0`) or f32 (twice the
//! bytes; what llama.cpp's reference logits were made with).
//!
//! Layout. f16 and f32 caches hold `stride` positions, `n_ctx` rounded up
//! to 16, and are stored the way [`kernels::vecops::attend`] reads them
//! (16 positions per vector, several query heads per key load, f16
//! widened as it is loaded): keys in blocks of 16 positions, `(n_layers,
//! n_kv_heads, stride / 16, head_dim, 16)`, so the score pass over a long
//! context is one sequential read; values by columns, `(n_layers,
//! n_kv_heads, head_dim, stride)`, one dimension of a head's positions
//! contiguous. A Q8_0 block runs
//! along a head, so a Q8_0 cache is stored by rows, `(n_layers, n_ctx,
//! n_kv_heads, head_bytes)`, a head as whole blocks (which is why Q8_0
//! needs `head_dim` to be a multiple of 32), and attention widens a layer's
//! rows to f32 before reading them.

use crate::Error;
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use half::f16;
use kernels::pages::HugeBuf;
use kernels::quant::f16::f32_to_f16_row;
use kernels::traits::traits;
use kernels::vecops::{key_index, KEY_BLOCK};
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

/// Conversions between a head stored by rows (q8_0) and f32: the traits
/// table's.
#[derive(Clone, Copy)]
struct Codec {
    to_f32: fn(&[u8], &mut [f32]),
    from_f32: fn(&[f32], &mut [u8]),
}

impl Codec {
    fn for_type(ty: KvType) -> Codec {
        let tr = traits(ty.ggml_type()).expect("the kernels support f16, q8_0 and f32");
        Codec {
            to_f32: tr.to_float,
            from_f32: tr.from_float,
        }
    }
}

pub struct KvCache {
    ty: KvType,
    codec: Codec,
    n_layers: usize,
    n_ctx: usize,
    /// Positions held: `n_ctx` rounded up to whole key blocks (f16, f32),
    /// `n_ctx` (q8_0).
    stride: usize,
    n_kv_heads: usize,
    head_dim: usize,
    head_bytes: usize,
    /// In huge pages from 4 MiB: decode at depth reads all of them every
    /// token.
    keys: HugeBuf<Word>,
    values: HugeBuf<Word>,
}

/// Positions a cache of `n_ctx` holds (see [`KvCache`]'s `stride`).
fn stride_for(ty: KvType, n_ctx: usize) -> usize {
    match ty {
        KvType::Q8_0 => n_ctx,
        KvType::F16 | KvType::F32 => n_ctx.next_multiple_of(KEY_BLOCK),
    }
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
        let map = || {
            HugeBuf::zeroed(words).map_err(|e| Error::BadValue {
                key: "context".into(),
                problem: format!("cannot map the KV cache ({bytes} bytes of keys): {e}"),
            })
        };
        Ok(KvCache {
            ty,
            codec: Codec::for_type(ty),
            n_layers,
            n_ctx,
            stride: stride_for(ty, n_ctx),
            n_kv_heads,
            head_dim,
            head_bytes,
            keys: map()?,
            values: map()?,
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
        let stride = stride_for(ty, n_ctx) as u64;
        Some(2 * n_layers as u64 * stride * n_kv_heads as u64 * hb)
    }

    pub fn ty(&self) -> KvType {
        self.ty
    }

    /// Bytes held (keys and values).
    pub fn bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * 8
    }

    /// Stored by columns (f16, f32) rather than by rows (q8_0).
    fn by_columns(&self) -> bool {
        self.ty != KvType::Q8_0
    }

    /// Bytes of one layer of keys (or values).
    fn layer_bytes(&self) -> usize {
        self.stride * self.n_kv_heads * self.head_bytes
    }

    /// Store one position's keys and values, `(n_kv_heads · head_dim,)` each.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        assert!(
            pos < self.n_ctx,
            "KV cache: position {pos} ≥ n_ctx {}",
            self.n_ctx
        );
        let kv_dim = self.n_kv_heads * self.head_dim;
        assert!(
            k.len() == kv_dim && v.len() == kv_dim,
            "KV cache: store takes {kv_dim} keys and values"
        );
        let (hd, hb, stride) = (self.head_dim, self.head_bytes, self.stride);
        let layer_bytes = self.layer_bytes();
        let span = layer * layer_bytes..(layer + 1) * layer_bytes;
        let (ty, from_float) = (self.ty, self.codec.from_f32);
        for (buf, x, is_key) in [(&mut self.keys, k, true), (&mut self.values, v, false)] {
            let bytes = &mut bytemuck::cast_slice_mut::<Word, u8>(buf)[span.clone()];
            // Dimension d of head g goes to base(g) + d·step: what
            // [`column_index`] gives, without two divisions per element.
            let (lead, step) = if is_key {
                (key_index(hd, pos, 0), KEY_BLOCK)
            } else {
                (pos, stride)
            };
            debug_assert!(hd < 2 || lead + step == column_index(is_key, hd, stride, pos, 1));
            let heads = x.chunks_exact(hd).enumerate();
            match ty {
                KvType::F16 => {
                    let cols = bytemuck::cast_slice_mut::<u8, f16>(bytes);
                    // Narrowed a chunk at a time by the row converter
                    // (F16C where the CPU has it), then scattered.
                    let mut h = [f16::ZERO; 64];
                    for (g, xg) in heads {
                        let base = g * hd * stride + lead;
                        for (c, xc) in xg.chunks(h.len()).enumerate() {
                            f32_to_f16_row(xc, &mut h[..xc.len()]);
                            let at = base + c * h.len() * step;
                            for (j, &hj) in h[..xc.len()].iter().enumerate() {
                                cols[at + j * step] = hj;
                            }
                        }
                    }
                }
                KvType::F32 => {
                    let cols = bytemuck::cast_slice_mut::<u8, f32>(bytes);
                    for (g, xg) in heads {
                        let base = g * hd * stride + lead;
                        for (d, &xd) in xg.iter().enumerate() {
                            cols[base + d * step] = xd;
                        }
                    }
                }
                KvType::Q8_0 => {
                    let row_bytes = kv_dim / hd * hb;
                    let row = &mut bytes[pos * row_bytes..][..row_bytes];
                    for (dst, src) in row.chunks_exact_mut(hb).zip(x.chunks_exact(hd)) {
                        from_float(src, dst);
                    }
                }
            }
        }
    }

    /// Copy `positions` of every layer's keys and values into `dst`, a
    /// cache of the same shape (a sequence's prefix shared with another:
    /// the same bits as evaluating those positions again, for a fraction
    /// of the time). Panics on another shape or positions past `n_ctx`.
    pub fn copy_positions(&self, dst: &mut KvCache, positions: std::ops::Range<usize>) {
        assert!(
            (
                self.ty,
                self.n_layers,
                self.n_ctx,
                self.n_kv_heads,
                self.head_dim
            ) == (
                dst.ty,
                dst.n_layers,
                dst.n_ctx,
                dst.n_kv_heads,
                dst.head_dim
            ),
            "KV cache: copy between caches of different shapes"
        );
        assert!(
            positions.start <= positions.end && positions.end <= self.n_ctx,
            "KV cache: copy of positions {positions:?} past n_ctx {}",
            self.n_ctx
        );
        if positions.is_empty() {
            return;
        }
        let layer_bytes = self.layer_bytes();
        for (from, to, is_key) in [
            (&self.keys, &mut dst.keys, true),
            (&self.values, &mut dst.values, false),
        ] {
            let from = bytemuck::cast_slice::<Word, u8>(from);
            let to = bytemuck::cast_slice_mut::<Word, u8>(to);
            for layer in 0..self.n_layers {
                let base = layer * layer_bytes;
                if !self.by_columns() {
                    // By rows, a layer's positions are one run.
                    let row = self.n_kv_heads * self.head_bytes;
                    let span = base + positions.start * row..base + positions.end * row;
                    to[span.clone()].copy_from_slice(&from[span]);
                    continue;
                }
                // By columns, each element of a row is a run of positions:
                // contiguous over all of them (values), or within one
                // block of 16 (keys).
                let elem = self.head_bytes / self.head_dim;
                for i in 0..self.n_kv_heads * self.head_dim {
                    let mut p = positions.start;
                    while p < positions.end {
                        let run_end = if is_key {
                            (p / KEY_BLOCK + 1) * KEY_BLOCK
                        } else {
                            positions.end
                        }
                        .min(positions.end);
                        let at =
                            base + column_index(is_key, self.head_dim, self.stride, p, i) * elem;
                        let span = at..at + (run_end - p) * elem;
                        to[span.clone()].copy_from_slice(&from[span]);
                        p = run_end;
                    }
                }
            }
        }
    }

    /// A reader for one layer's cached heads.
    pub fn layer(&self, layer: usize) -> LayerKv<'_> {
        let len = self.layer_bytes();
        let span = layer * len..(layer + 1) * len;
        let keys = &bytemuck::cast_slice::<Word, u8>(&self.keys)[span.clone()];
        let values = &bytemuck::cast_slice::<Word, u8>(&self.values)[span];
        let stored = match self.ty {
            KvType::F16 => Stored::Columns(Columns::F16 {
                keys: bytemuck::cast_slice(keys),
                values: bytemuck::cast_slice(values),
            }),
            KvType::F32 => Stored::Columns(Columns::F32 {
                keys: bytemuck::cast_slice(keys),
                values: bytemuck::cast_slice(values),
            }),
            KvType::Q8_0 => Stored::Rows { keys, values },
        };
        debug_assert_eq!(self.by_columns(), matches!(stored, Stored::Columns(_)));
        LayerKv {
            stored,
            n_ctx: self.n_ctx,
            stride: self.stride,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            head_bytes: self.head_bytes,
            to_f32: self.codec.to_f32,
        }
    }
}

/// Where element `i` of a row (head `i / hd`, dimension `i % hd`) of
/// position `pos` is in a layer of an f16 or f32 cache: keys in blocks of
/// 16 positions, values by columns.
fn column_index(is_key: bool, hd: usize, stride: usize, pos: usize, i: usize) -> usize {
    let (head, dim) = (i / hd, i % hd);
    if is_key {
        head * hd * stride + key_index(hd, pos, dim)
    } else {
        i * stride + pos
    }
}

/// A layer of an f16 or f32 cache, kv head `h`'s part starting at `h ·
/// head_dim · stride` (`stride`: [`LayerKv::stride`]): keys `(n_kv_heads,
/// stride / 16, head_dim, 16)` ([`kernels::vecops::key_index`]), values
/// `(n_kv_heads, head_dim, stride)`.
#[derive(Clone, Copy)]
pub enum Columns<'a> {
    F16 { keys: &'a [f16], values: &'a [f16] },
    F32 { keys: &'a [f32], values: &'a [f32] },
}

#[derive(Clone, Copy)]
enum Stored<'a> {
    Columns(Columns<'a>),
    /// `(n_ctx, n_kv_heads, head_bytes)` bytes.
    Rows {
        keys: &'a [u8],
        values: &'a [u8],
    },
}

/// One layer of the cache, shareable across the attention threads.
#[derive(Clone, Copy)]
pub struct LayerKv<'a> {
    stored: Stored<'a>,
    n_ctx: usize,
    stride: usize,
    n_kv_heads: usize,
    head_dim: usize,
    head_bytes: usize,
    to_f32: fn(&[u8], &mut [f32]),
}

impl<'a> LayerKv<'a> {
    /// The layer as columns, if the cache stores it so (f16, f32).
    pub fn columns(&self) -> Option<Columns<'a>> {
        match self.stored {
            Stored::Columns(c) => Some(c),
            Stored::Rows { .. } => None,
        }
    }

    /// Positions per kv head of [`LayerKv::columns`]: `n_ctx` rounded up
    /// to whole blocks of keys.
    pub fn stride(&self) -> usize {
        self.stride
    }

    fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Rows `positions` of keys (`values == false`) or values, widened into
    /// `out` `(positions.len(), n_kv_heads · head_dim)`.
    fn widen(&self, values: bool, positions: std::ops::Range<usize>, out: &mut [f32]) {
        let kv_dim = self.kv_dim();
        assert!(
            positions.end <= self.n_ctx && out.len() == positions.len() * kv_dim,
            "KV cache: widen {positions:?} into {} floats",
            out.len()
        );
        let (hd, stride) = (self.head_dim, self.stride);
        match self.stored {
            Stored::Rows { keys, values: vals } => {
                let buf = if values { vals } else { keys };
                let row = self.n_kv_heads * self.head_bytes;
                (self.to_f32)(&buf[positions.start * row..positions.end * row], out);
            }
            Stored::Columns(c) => {
                for (p, o) in positions.zip(out.chunks_exact_mut(kv_dim)) {
                    for (i, oi) in o.iter_mut().enumerate() {
                        let at = column_index(!values, hd, stride, p, i);
                        *oi = match c {
                            Columns::F16 { keys, values: v } => {
                                (if values { v } else { keys })[at].to_f32()
                            }
                            Columns::F32 { keys, values: v } => (if values { v } else { keys })[at],
                        };
                    }
                }
            }
        }
    }

    /// Keys of every kv head at `positions`, widened into `out`
    /// `(positions.len(), n_kv_heads · head_dim)` (for a cache stored by
    /// rows, one conversion call: a layer's positions are contiguous).
    pub fn widen_keys(&self, positions: std::ops::Range<usize>, out: &mut [f32]) {
        self.widen(false, positions, out)
    }

    /// Values, as [`LayerKv::widen_keys`].
    pub fn widen_values(&self, positions: std::ops::Range<usize>, out: &mut [f32]) {
        self.widen(true, positions, out)
    }

    /// Key of `kv_head` at `pos`, widened into `out` `(head_dim,)`.
    pub fn key(&self, pos: usize, kv_head: usize, out: &mut [f32]) {
        self.head(false, pos, kv_head, out)
    }

    /// Value of `kv_head` at `pos`, widened into `out` `(head_dim,)`.
    pub fn value(&self, pos: usize, kv_head: usize, out: &mut [f32]) {
        self.head(true, pos, kv_head, out)
    }

    fn head(&self, values: bool, pos: usize, kv_head: usize, out: &mut [f32]) {
        let mut row = vec![0.0; self.kv_dim()];
        self.widen(values, pos..pos + 1, &mut row);
        out.copy_from_slice(&row[kv_head * self.head_dim..][..self.head_dim]);
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
    fn copied_positions_read_back_the_same_and_nothing_else_moves() {
        // Inside one block of keys, and across blocks with a partial block
        // at each end.
        for (ctx, copied) in [(6, 1..4), (40, 10..35)] {
            for ty in [KvType::F16, KvType::Q8_0, KvType::F32] {
                let (layers, heads, hd) = (2, 3, 32);
                let mut src = KvCache::new(ty, layers, ctx, heads, hd).unwrap();
                let mut dst = KvCache::new(ty, layers, ctx, heads, hd).unwrap();
                let row = |l: usize, p: usize, s: f32| -> Vec<f32> {
                    (0..heads * hd)
                        .map(|i| s * ((l * 5 + p * 7 + i) % 13) as f32 / 13.0 - 0.3)
                        .collect()
                };
                for l in 0..layers {
                    for p in 0..ctx {
                        src.store(l, p, &row(l, p, 1.0), &row(l, p, -1.0));
                        dst.store(l, p, &row(l, p, 3.0), &row(l, p, 2.0));
                    }
                }
                src.copy_positions(&mut dst, copied.clone());
                let (mut a, mut b) = (vec![0.0; hd], vec![0.0; hd]);
                for l in 0..layers {
                    for p in 0..ctx {
                        for h in 0..heads {
                            let from = if copied.contains(&p) { &src } else { &dst };
                            from.layer(l).key(p, h, &mut a);
                            dst.layer(l).key(p, h, &mut b);
                            assert_eq!(a, b, "{ty} key l{l} p{p} h{h}");
                            from.layer(l).value(p, h, &mut a);
                            dst.layer(l).value(p, h, &mut b);
                            assert_eq!(a, b, "{ty} value l{l} p{p} h{h}");
                        }
                    }
                }
                // The positions around the copied ones kept dst's own
                // values.
                for p in [copied.start - 1, copied.end] {
                    src.layer(1).key(p, 2, &mut a);
                    dst.layer(1).key(p, 2, &mut b);
                    assert_ne!(a, b, "{ty} p{p}");
                }
            }
        }
    }

    #[test]
    fn store_and_read_back() {
        // Several blocks of 16 positions, and a head longer than the
        // 64-element chunks the f16 store narrows.
        let types = [KvType::F16, KvType::Q8_0, KvType::F32];
        let shapes = types.into_iter().flat_map(|t| [(t, 5, 64), (t, 40, 96)]);
        for (ty, ctx, hd) in shapes {
            let (layers, heads) = (2, 3);
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

//! Attention of one token's query heads over a cache layer stored by
//! columns (f16 or f32, [`Columns`]): the setup the kernels in
//! [`kernels::vecops`] read, shared by every architecture.

use crate::kv_cache::Columns;
use kernels::vecops::{self, Attention, KvElement, KEY_BLOCK};

/// Query heads `q` over positions `span` of one kv head's keys `(stride /
/// 16, hd, 16)` and values `(hd, stride)`, each over its first `head_pos`
/// of them when given.
#[allow(clippy::too_many_arguments)]
fn attention<'a, T: KvElement>(
    q: &'a [f32],
    hd: usize,
    keys: &'a [T],
    values: &'a [T],
    stride: usize,
    span: std::ops::RangeInclusive<usize>,
    scale: Scale,
    head_pos: &'a [usize],
) -> Attention<'a, T> {
    // Positions `first..=last`: the kernel starts at the block holding
    // `first` (keys) and at that block's first position (values: position
    // p of dimension i is at i·stride + p, so the slice shifts every row).
    let (first, last) = (*span.start(), *span.end());
    let lead = first % KEY_BLOCK;
    let start = first - lead;
    Attention {
        q,
        head_dim: hd,
        keys: &keys[start * hd..],
        values: &values[start..],
        stride,
        first: lead,
        n_pos: last + 1 - first,
        head_pos,
        scale: scale.scale,
        softcap: scale.softcap,
    }
}

/// How scores are scaled before the softmax: `scale · q·k`, then
/// `softcap · tanh(s / softcap)` when `softcap > 0`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scale {
    pub scale: f32,
    pub softcap: f32,
}

/// Positions per segment. Attention over more positions is computed a
/// segment at a time and the segments' results folded in order
/// ([`fold`]), so one token's heads over a long context can be split over
/// threads and still give the same bits as one thread; up to `SEGMENT`
/// positions it is one kernel call.
pub(crate) const SEGMENT: usize = 512;

/// Floats of work area one [`Heads`] call needs, for `group` query heads
/// of `hd` over a layer of `stride` positions: a segment's scores, a
/// segment's output and softmax statistics, the running statistics.
/// Linear in `group`: `t` tokens' heads take `t` times one token's.
pub(crate) fn work_floats(group: usize, hd: usize, stride: usize) -> usize {
    group * (vecops::scores_len(stride.min(SEGMENT)) + hd + 4)
}

/// Most query heads of one [`Heads`] call: tokens are batched into a call
/// up to this many heads.
pub(crate) const MAX_HEADS: usize = 24;

/// The query heads `q` `(tokens, group, hd)` that share kv head `kv_head`,
/// of `tokens` consecutive tokens of one sequence ending at position
/// `last`, each attending over positions `first..=` its own (`0..=pos`,
/// or a sliding window's last positions, the same start for all) of
/// `cols`, a layer of `stride` positions
/// ([`crate::kv_cache::LayerKv::stride`]). Several tokens share every key
/// and value load (a prompt's batch), and each head gets the bits it
/// would get alone. The tokens must span the same [`Heads::segments`].
#[derive(Clone, Copy)]
pub(crate) struct Heads<'a> {
    pub cols: Columns<'a>,
    pub kv_head: usize,
    pub hd: usize,
    pub stride: usize,
    pub q: &'a [f32],
    pub first: usize,
    pub last: usize,
    pub tokens: usize,
    pub scale: Scale,
}

/// Segments of positions `first..=last` ([`SEGMENT`] each from the key
/// block that holds `first`).
pub(crate) fn segments(first: usize, last: usize) -> usize {
    let start = first - first % KEY_BLOCK;
    (last + 1 - start).div_ceil(SEGMENT)
}

impl Heads<'_> {
    fn group(&self) -> usize {
        self.q.len() / self.hd
    }

    /// The segments: [`SEGMENT`] positions each from the key block that
    /// holds `first`.
    pub fn segments(&self) -> usize {
        segments(self.first, self.last)
    }

    /// Segment `s` (< [`Heads::segments`]): `work` is [`work_floats`]
    /// long; the segment's output `(group, hd)` and statistics `(group,
    /// 2)` are left in it, see [`Heads::segment_result`].
    pub fn segment(&self, s: usize, work: &mut [f32]) {
        let (group, hd) = (self.group(), self.hd);
        let (scores, rest) = work.split_at_mut(work.len() - group * (hd + 4));
        let (out, rest) = rest.split_at_mut(group * hd);
        self.segment_into(s, scores, out, &mut rest[..2 * group]);
    }

    /// The output and statistics [`Heads::segment`] left in `work`.
    pub fn segment_result<'w>(&self, work: &'w [f32]) -> (&'w [f32], &'w [f32]) {
        let (group, hd) = (self.group(), self.hd);
        let rest = &work[work.len() - group * (hd + 4)..];
        (&rest[..group * hd], &rest[group * hd..][..2 * group])
    }

    fn segment_into(&self, s: usize, scores: &mut [f32], out: &mut [f32], stats: &mut [f32]) {
        let start = self.first - self.first % KEY_BLOCK;
        let lo = self.first.max(start + s * SEGMENT);
        let hi = self.last.min(start + (s + 1) * SEGMENT - 1);
        let (hd, stride) = (self.hd, self.stride);
        // Kv head g's keys and values (hd · stride each) start at g·hd·stride.
        let span = self.kv_head * hd * stride..(self.kv_head + 1) * hd * stride;
        let q = self.q;
        // Token j of the call ends at last − (tokens − 1) + j: in this
        // segment it sees lo..=min(that, hi).
        let (tokens, group) = (self.tokens.max(1), self.group());
        let per_token = group / tokens;
        let first_last = self.last + 1 - tokens;
        assert!(
            tokens == 1
                || (group <= MAX_HEADS
                    && group == per_token * tokens
                    && segments(self.first, first_last) == self.segments()),
            "attention: {tokens} tokens' {group} heads must share their segments"
        );
        let mut counts = [0usize; MAX_HEADS];
        let head_pos: &[usize] = if tokens > 1 && first_last < hi {
            for (h, c) in counts[..group].iter_mut().enumerate() {
                *c = (first_last + h / per_token).min(hi) + 1 - lo;
            }
            &counts[..group]
        } else {
            &[]
        };
        match self.cols {
            Columns::F16 { keys, values } => {
                let (k, v) = (&keys[span.clone()], &values[span]);
                let a = attention(q, hd, k, v, stride, lo..=hi, self.scale, head_pos);
                vecops::attend_f16(&a, scores, out, stats)
            }
            Columns::F32 { keys, values } => {
                let (k, v) = (&keys[span.clone()], &values[span]);
                let a = attention(q, hd, k, v, stride, lo..=hi, self.scale, head_pos);
                vecops::attend(&a, scores, out, stats)
            }
        }
    }

    /// Fold the segments' works [`Heads::segment`] left (in order, one
    /// per segment) into `out` `(group, hd)` and `stats` `(group, 2)`: the
    /// same bits as [`Heads::attend`].
    pub fn gather<'w>(
        &self,
        mut segs: impl Iterator<Item = &'w [f32]>,
        out: &mut [f32],
        stats: &mut [f32],
    ) {
        let (o0, s0) = self.segment_result(segs.next().expect("at least one segment"));
        out.copy_from_slice(o0);
        stats.copy_from_slice(s0);
        for work in segs.take(self.segments() - 1) {
            let (seg_out, seg_stats) = self.segment_result(work);
            fold(self.hd, out, stats, seg_out, seg_stats);
        }
    }

    /// Every segment in order into `out` `(group, hd)`, with `work`
    /// [`work_floats`] long.
    pub fn attend(&self, work: &mut [f32], out: &mut [f32]) {
        let (group, hd) = (self.group(), self.hd);
        let (scores, rest) = work.split_at_mut(work.len() - group * (hd + 4));
        let (seg_out, rest) = rest.split_at_mut(group * hd);
        let (seg_stats, stats) = rest.split_at_mut(2 * group);
        self.segment_into(0, scores, out, stats);
        for s in 1..self.segments() {
            self.segment_into(s, scores, seg_out, seg_stats);
            fold(hd, out, stats, seg_out, seg_stats);
        }
    }
}

/// Fold a later segment's output `seg_out` `(group, hd)` and statistics
/// `seg_stats` (per head: the maximum score and the sum of exponentials
/// from it) into the running ones: each side weighted by its share of the
/// combined softmax sum.
pub(crate) fn fold(
    hd: usize,
    out: &mut [f32],
    stats: &mut [f32],
    seg_out: &[f32],
    seg_stats: &[f32],
) {
    let heads = out
        .chunks_exact_mut(hd)
        .zip(stats.chunks_exact_mut(2))
        .zip(seg_out.chunks_exact(hd).zip(seg_stats.chunks_exact(2)));
    for ((o, st), (so, sst)) in heads {
        let m = st[0].max(sst[0]);
        let a = st[1] * vecops::exp(st[0] - m);
        let b = sst[1] * vecops::exp(sst[0] - m);
        let total = a + b;
        let (wa, wb) = (a / total, b / total);
        for (x, &y) in o.iter_mut().zip(so) {
            *x = *x * wa + y * wb;
        }
        st.copy_from_slice(&[m, total]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvCache, KvType};

    /// A pseudo-random value in [-1, 1) for (position, element, salt).
    fn val(p: usize, i: usize, salt: usize) -> f32 {
        let h = (p * 7919 + i * 104_729 + salt * 1_299_709) as u64;
        let h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        (h as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Several consecutive tokens' heads in one call, across segment
    /// boundaries and windows: each token's heads get the bits of a call
    /// of their own, segments computed apart and gathered too.
    #[test]
    fn tokens_batched_match_one_token_calls() {
        let (n_ctx, nkv, hd, group) = (1300, 2, 8, 3);
        for ty in [KvType::F32, KvType::F16] {
            let mut cache = KvCache::new(ty, 1, n_ctx, nkv, hd).unwrap();
            let row = |p: usize, salt: usize| -> Vec<f32> {
                (0..nkv * hd).map(|i| val(p, i, salt) * 2.0).collect()
            };
            for p in 0..n_ctx {
                cache.store(0, p, &row(p, 1), &row(p, 2));
            }
            let kv = cache.layer(0);
            // (first, last of the last token, tokens): within one segment,
            // ending exactly on a segment's end, past a boundary, a window.
            for (first, last, tokens) in [
                (0, 7, 8),
                (0, 511, 5),
                (0, 1100, 8),
                (0, 530, 3),
                (5, 700, 4),
                (0, 0, 1),
            ] {
                let q: Vec<f32> = (0..tokens * group * hd)
                    .map(|i| val(i, 0, 3) * 3.0)
                    .collect();
                let scale = Scale {
                    scale: 0.35,
                    softcap: 0.0,
                };
                for g in 0..nkv {
                    let heads = Heads {
                        cols: kv.columns().unwrap(),
                        kv_head: g,
                        hd,
                        stride: kv.stride(),
                        q: &q,
                        first,
                        last,
                        tokens,
                        scale,
                    };
                    let item = work_floats(tokens * group, hd, kv.stride());
                    let mut work = vec![f32::NAN; item];
                    let mut out = vec![f32::NAN; tokens * group * hd];
                    heads.attend(&mut work, &mut out);
                    let n_seg = heads.segments();
                    let mut items = vec![f32::NAN; n_seg * item];
                    for s in (0..n_seg).rev() {
                        heads.segment(s, &mut items[s * item..][..item]);
                    }
                    let mut gathered = vec![f32::NAN; tokens * group * hd];
                    let mut stats = vec![f32::NAN; 2 * tokens * group];
                    heads.gather(items.chunks_exact(item), &mut gathered, &mut stats);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&gathered),
                        bits(&out),
                        "{ty} {first}..={last} x{tokens}"
                    );
                    for j in 0..tokens {
                        let qj = &q[j * group * hd..(j + 1) * group * hd];
                        let one = Heads {
                            q: qj,
                            last: last + 1 - tokens + j,
                            tokens: 1,
                            ..heads
                        };
                        let mut w1 = vec![f32::NAN; work_floats(group, hd, kv.stride())];
                        let mut o1 = vec![f32::NAN; group * hd];
                        one.attend(&mut w1, &mut o1);
                        assert_eq!(
                            bits(&out[j * group * hd..(j + 1) * group * hd]),
                            bits(&o1),
                            "{ty} {first}..={last} x{tokens}: token {j}"
                        );
                    }
                }
            }
        }
    }

    /// Segmented attention over long ranges (several segments, a window
    /// starting inside a block, one position) against an f64 softmax, and
    /// the segments computed apart then gathered give the same bits as
    /// one call.
    #[test]
    fn segments_fold_to_the_softmax_and_gather_matches_attend() {
        let (n_ctx, nkv, hd, group) = (1300, 2, 8, 3);
        for ty in [KvType::F32, KvType::F16] {
            let mut cache = KvCache::new(ty, 1, n_ctx, nkv, hd).unwrap();
            let row = |p: usize, salt: usize| -> Vec<f32> {
                (0..nkv * hd).map(|i| val(p, i, salt) * 2.0).collect()
            };
            for p in 0..n_ctx {
                cache.store(0, p, &row(p, 1), &row(p, 2));
            }
            let kv = cache.layer(0);
            let q: Vec<f32> = (0..group * hd).map(|i| val(i, 0, 3) * 3.0).collect();
            let (mut key, mut value) = (vec![0.0; hd], vec![0.0; hd]);
            for (first, last) in [
                (0, 1299),
                (0, 511),
                (0, 512),
                (5, 1100),
                (700, 1299),
                (0, 0),
            ] {
                for g in 0..nkv {
                    let heads = Heads {
                        cols: kv.columns().unwrap(),
                        kv_head: g,
                        hd,
                        stride: kv.stride(),
                        q: &q,
                        first,
                        last,
                        tokens: 1,
                        scale: Scale {
                            scale: 0.35,
                            softcap: 0.0,
                        },
                    };
                    let item = work_floats(group, hd, kv.stride());
                    let mut work = vec![f32::NAN; item];
                    let mut out = vec![f32::NAN; group * hd];
                    heads.attend(&mut work, &mut out);
                    // f64 reference, from the cache's own (rounded) values.
                    for (h, qh) in q.chunks_exact(hd).enumerate() {
                        let mut s = vec![];
                        for p in first..=last {
                            kv.key(p, g, &mut key);
                            let d: f64 = qh
                                .iter()
                                .zip(&key)
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum();
                            s.push(d * 0.35);
                        }
                        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                        let z: f64 = e.iter().sum();
                        let mut want = vec![0.0f64; hd];
                        for (p, w) in (first..=last).zip(&e) {
                            kv.value(p, g, &mut value);
                            for (o, &v) in want.iter_mut().zip(&value) {
                                *o += w * v as f64 / z;
                            }
                        }
                        for (d, &w) in want.iter().enumerate() {
                            let got = out[h * hd + d] as f64;
                            assert!(
                                (got - w).abs() < 2e-5,
                                "{ty} {first}..={last} kv {g} head {h} dim {d}: {got} vs {w}"
                            );
                        }
                    }
                    // Apart, in reverse order (as threads might), then
                    // gathered.
                    let n_seg = heads.segments();
                    assert_eq!(n_seg, (last + 1 - first / 16 * 16).div_ceil(SEGMENT));
                    let mut items = vec![f32::NAN; n_seg * item];
                    for s in (0..n_seg).rev() {
                        heads.segment(s, &mut items[s * item..][..item]);
                    }
                    let mut gathered = vec![f32::NAN; group * hd];
                    let mut stats = vec![f32::NAN; 2 * group];
                    heads.gather(items.chunks_exact(item), &mut gathered, &mut stats);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&gathered), bits(&out), "{ty} {first}..={last}");
                }
            }
        }
    }
}

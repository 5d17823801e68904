//! Attention of one token's query heads over a cache layer stored by
//! columns (f16 or f32, [`Columns`]): the setup the kernels in
//! [`kernels::vecops`] read, shared by every architecture.

use crate::kv_cache::Columns;
use kernels::vecops::{self, Attention, KvElement};

/// Query heads `q` over positions `0..=pos` of one kv head's `(hd,
/// n_ctx)` keys and values.
fn attention<'a, T: KvElement>(
    q: &'a [f32],
    hd: usize,
    keys: &'a [T],
    values: &'a [T],
    n_ctx: usize,
    span: std::ops::RangeInclusive<usize>,
    scale: Scale,
) -> Attention<'a, T> {
    // Positions `first..=last`: the layout puts position p of dimension i
    // at i·n_ctx + p, so starting the slices at `first` shifts every row.
    let (first, last) = (*span.start(), *span.end());
    Attention {
        q,
        head_dim: hd,
        keys: &keys[first..],
        values: &values[first..],
        stride: n_ctx,
        n_pos: last + 1 - first,
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

/// One token: its query heads `qg` `(group, hd)` that share kv head
/// `kv_head` attend over positions `visible` (`0..=pos`, or a sliding
/// window's last positions) of `cols`, a layer of `n_ctx` positions; `out`
/// gets `(group, hd)`. `scores` holds at least `group ·`
/// [`vecops::scores_len`]`(n_ctx)` floats.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_columns(
    cols: Columns<'_>,
    kv_head: usize,
    hd: usize,
    n_ctx: usize,
    qg: &[f32],
    visible: std::ops::RangeInclusive<usize>,
    scale: Scale,
    scores: &mut [f32],
    out: &mut [f32],
) {
    // Kv head g's rows (hd of n_ctx positions) start at g·hd·n_ctx.
    let span = kv_head * hd * n_ctx..(kv_head + 1) * hd * n_ctx;
    match cols {
        Columns::F16 { keys, values } => {
            let (k, v) = (&keys[span.clone()], &values[span]);
            vecops::attend_f16(&attention(qg, hd, k, v, n_ctx, visible, scale), scores, out)
        }
        Columns::F32 { keys, values } => {
            let (k, v) = (&keys[span.clone()], &values[span]);
            vecops::attend(&attention(qg, hd, k, v, n_ctx, visible, scale), scores, out)
        }
    }
}

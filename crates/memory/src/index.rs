//! The in-RAM index, rebuilt from the records when a file opens: per block
//! its place in the file and history, its int4 summaries as stored, and the
//! summaries' sign bits transposed for the fast scan (see
//! [`crate::kernels::fast_scan`]).

use crate::format::Geometry;
use crate::kernels::GROUP;

/// Where a block sits in the file and in the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMeta {
    /// Byte offset of the record in the file.
    pub offset: u64,
    /// History index of the block's first token.
    pub first_token: u64,
    pub n_tokens: u16,
    pub flags: u16,
    /// The record's stored checksum.
    pub crc: u32,
}

/// For a byte of two nibbles: bit 0 set when the low value (nibble − 8)
/// is positive, bit 1 for the high one.
static SIGN2: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = ((b & 15 > 8) as u8) | (((b >> 4 > 8) as u8) << 1);
        b += 1;
    }
    t
};

#[derive(Clone, Debug)]
pub struct Index {
    geometry: Geometry,
    metas: Vec<BlockMeta>,
    /// `[block][slot][summary bytes]`, as in the records.
    summaries: Vec<u8>,
    /// Per slot `[group][code byte][GROUP]`: bit `d` of a block's entry is
    /// set when the summary's value `d` is positive. One stream per slot,
    /// so scanning fewer slots reads fewer bytes.
    signs: Vec<Vec<u8>>,
    tokens: u64,
}

impl Index {
    pub fn new(geometry: Geometry) -> Index {
        Index {
            geometry,
            metas: Vec::new(),
            summaries: Vec::new(),
            signs: vec![Vec::new(); geometry.slots as usize],
            tokens: 0,
        }
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn len(&self) -> usize {
        self.metas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// Tokens in the history.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    pub fn meta(&self, block: usize) -> &BlockMeta {
        &self.metas[block]
    }

    pub fn metas(&self) -> &[BlockMeta] {
        &self.metas
    }

    /// The block whose tokens include history index `token`, if any.
    pub fn block_of_token(&self, token: u64) -> Option<usize> {
        if token >= self.tokens {
            return None;
        }
        Some(self.metas.partition_point(|m| m.first_token <= token) - 1)
    }

    /// One block's summaries, `slots · summary_bytes` bytes.
    pub fn summaries(&self, block: usize) -> &[u8] {
        let n = self.geometry.summaries_len();
        &self.summaries[block * n..(block + 1) * n]
    }

    /// Every block's summaries, `[block][slot][summary bytes]`.
    pub fn all_summaries(&self) -> &[u8] {
        &self.summaries
    }

    /// Slot `slot`'s whole groups of transposed sign bits (the last one
    /// zero-padded).
    pub fn signs(&self, slot: usize) -> &[u8] {
        &self.signs[slot]
    }

    /// Bytes of one group in one slot's stream.
    pub fn group_bytes(&self) -> usize {
        self.geometry.code_bytes as usize * GROUP
    }

    /// Bytes of RAM the index holds (capacity, not just length).
    pub fn memory_bytes(&self) -> usize {
        self.metas.capacity() * std::mem::size_of::<BlockMeta>()
            + self.summaries.capacity()
            + self.signs.iter().map(Vec::capacity).sum::<usize>()
    }

    pub(crate) fn reserve(&mut self, blocks: usize) {
        self.metas.reserve(blocks);
        self.summaries
            .reserve(blocks * self.geometry.summaries_len());
        let gb = self.group_bytes();
        for s in &mut self.signs {
            s.reserve(blocks.div_ceil(GROUP) * gb);
        }
    }

    pub(crate) fn push(&mut self, meta: BlockMeta, summaries: &[u8]) {
        let g = self.geometry;
        debug_assert_eq!(summaries.len(), g.summaries_len());
        let block = self.metas.len();
        let (group, lane) = (block / GROUP, block % GROUP);
        let gb = self.group_bytes();
        if lane == 0 {
            for s in &mut self.signs {
                s.resize((group + 1) * gb, 0);
            }
        }
        let base = group * gb;
        for (s, sum) in summaries.chunks_exact(g.summary_bytes()).enumerate() {
            for (b, nib) in sum[2..].chunks_exact(4).enumerate() {
                // Four nibble bytes hold the eight values of code byte b.
                let byte = SIGN2[nib[0] as usize]
                    | SIGN2[nib[1] as usize] << 2
                    | SIGN2[nib[2] as usize] << 4
                    | SIGN2[nib[3] as usize] << 6;
                self.signs[s][base + b * GROUP + lane] = byte;
            }
        }
        self.summaries.extend_from_slice(summaries);
        self.tokens += meta.n_tokens as u64;
        self.metas.push(meta);
    }

    pub(crate) fn truncate(&mut self, blocks: usize) {
        if blocks >= self.metas.len() {
            return;
        }
        self.metas.truncate(blocks);
        self.tokens = self
            .metas
            .last()
            .map_or(0, |m| m.first_token + m.n_tokens as u64);
        self.summaries
            .truncate(blocks * self.geometry.summaries_len());
        let groups = blocks.div_ceil(GROUP);
        let gb = self.group_bytes();
        for s in &mut self.signs {
            s.truncate(groups * gb);
            if !blocks.is_multiple_of(GROUP) {
                // Zero the dropped lanes of the last group, as `push` expects.
                for row in s[(groups - 1) * gb..].chunks_exact_mut(GROUP) {
                    row[blocks % GROUP..].fill(0);
                }
            }
        }
    }
}

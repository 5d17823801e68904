//! The in-RAM index, rebuilt from the records (or the index file) when a
//! file opens: per block its place in the file and history, its int4
//! summaries as stored, and the summaries' sign bits transposed for the
//! fast scan (see [`crate::kernels::fast_scan`]).
//!
//! Sign bits are laid out in tiles of [`TILE_GROUPS`] groups of
//! [`GROUP`] blocks: `[tile][slot][group in tile][code byte][block in
//! group]`. Within a tile each slot's run is 8 KB (for 8-byte codes) and
//! the slots' runs follow one another, so a scan of every slot reads memory
//! front to back, and a scan of some slots reads whole 8 KB runs of those
//! only. Measured at 100M tokens (450 MB of sign bits, shared VM): all
//! slots interleaved per group scanned all 36 slots in ~70 ms but a 12-slot
//! subset no faster; one stream per slot scanned 12 slots in ~18 ms but all
//! 36 in ~150 ms (36 streams outrun the prefetchers).

use crate::format::Geometry;
use crate::kernels::GROUP;

/// Groups per tile of the sign-bit layout.
pub const TILE_GROUPS: usize = 16;

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

/// Ask Linux to back the unused capacity of `v` with huge pages (when
/// the system allows them for regions that ask: transparent huge pages in
/// "madvise" mode, a common default). Only worth it for arrays of many
/// megabytes; a hint, nothing fails if it is not taken.
fn advise_huge_pages(v: &mut Vec<u8>) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        if v.capacity() - v.len() < 4 << 20 {
            return;
        }
        let spare = v.spare_capacity_mut();
        let start = spare.as_mut_ptr() as usize;
        let from = start.div_ceil(PAGE) * PAGE;
        let to = (start + spare.len()) / PAGE * PAGE;
        if to > from {
            // SAFETY: [from, to) lies inside `v`'s allocation (its unused
            // capacity, rounded inward to whole pages), which `v` owns and
            // nothing else uses; MADV_HUGEPAGE changes only how the kernel
            // backs those pages, never their contents or validity.
            let _ = unsafe {
                rustix::mm::madvise(
                    from as *mut core::ffi::c_void,
                    to - from,
                    rustix::mm::Advice::LinuxHugepage,
                )
            };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

#[derive(Clone, Debug)]
pub struct Index {
    geometry: Geometry,
    metas: Vec<BlockMeta>,
    /// `[block][slot][summary bytes]`, as in the records.
    summaries: Vec<u8>,
    /// `[tile][slot][group][code byte][GROUP]`: bit `d` of a block's slot
    /// entry is set when the summary's value `d` is positive.
    signs: Vec<u8>,
    tokens: u64,
}

impl Index {
    pub fn new(geometry: Geometry) -> Index {
        Index {
            geometry,
            metas: Vec::new(),
            summaries: Vec::new(),
            signs: Vec::new(),
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

    /// Every tile of transposed sign bits (the last one zero-padded).
    pub fn sign_tiles(&self) -> &[u8] {
        &self.signs
    }

    /// Bytes of one slot's run in a tile: [`TILE_GROUPS`] groups.
    pub fn run_bytes(&self) -> usize {
        TILE_GROUPS * self.geometry.code_bytes as usize * GROUP
    }

    /// Bytes of one tile: every slot's run.
    pub fn tile_bytes(&self) -> usize {
        self.geometry.slots as usize * self.run_bytes()
    }

    fn sign_offset(&self, block: usize, slot: usize) -> usize {
        let (group, lane) = (block / GROUP, block % GROUP);
        let (tile, g) = (group / TILE_GROUPS, group % TILE_GROUPS);
        tile * self.tile_bytes()
            + slot * self.run_bytes()
            + g * self.geometry.code_bytes as usize * GROUP
            + lane
    }

    /// Bytes of RAM the index holds (capacity, not just length).
    pub fn memory_bytes(&self) -> usize {
        self.metas.capacity() * std::mem::size_of::<BlockMeta>()
            + self.summaries.capacity()
            + self.signs.capacity()
    }

    pub(crate) fn reserve(&mut self, blocks: usize) {
        self.metas.reserve(blocks);
        self.summaries
            .reserve(blocks * self.geometry.summaries_len());
        self.signs
            .reserve(blocks.div_ceil(GROUP * TILE_GROUPS) * self.tile_bytes());
        // Searches read the summaries at scattered places and the sign
        // tiles front to back: on 2 MB pages the summary pass misses the
        // TLB far less (measured at 100M tokens, one thread: summary pass
        // 7.4 -> 5.5 ms, coarse 24.4 -> 22.9 ms per retrieval).
        advise_huge_pages(&mut self.summaries);
        advise_huge_pages(&mut self.signs);
    }

    pub(crate) fn push(&mut self, meta: BlockMeta, summaries: &[u8]) {
        let g = self.geometry;
        debug_assert_eq!(summaries.len(), g.summaries_len());
        let block = self.metas.len();
        if block.is_multiple_of(GROUP * TILE_GROUPS) {
            self.signs.resize(self.signs.len() + self.tile_bytes(), 0);
        }
        for (s, sum) in summaries.chunks_exact(g.summary_bytes()).enumerate() {
            for (b, nib) in sum[2..].chunks_exact(4).enumerate() {
                // Four nibble bytes hold the eight values of code byte b.
                let byte = SIGN2[nib[0] as usize]
                    | SIGN2[nib[1] as usize] << 2
                    | SIGN2[nib[2] as usize] << 4
                    | SIGN2[nib[3] as usize] << 6;
                let at = self.sign_offset(block, s) + b * GROUP;
                self.signs[at] = byte;
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
        let per_tile = GROUP * TILE_GROUPS;
        let tiles = blocks.div_ceil(per_tile);
        self.signs.truncate(tiles * self.tile_bytes());
        // Zero the dropped blocks of the last tile, as `push` expects.
        for block in blocks..tiles * per_tile {
            for s in 0..self.geometry.slots as usize {
                for b in 0..self.geometry.code_bytes as usize {
                    let at = self.sign_offset(block, s) + b * GROUP;
                    self.signs[at] = 0;
                }
            }
        }
    }
}

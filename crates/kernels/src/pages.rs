//! Memory for large buffers that are read over and over (the bandwidth
//! probes, the KV cache): anonymous maps that start on a 2 MiB boundary,
//! with transparent huge pages advised.
//!
//! Streaming many MiB through 4 KiB pages takes a TLB miss every 4 KiB.
//! On the Zen 4 this was written on, one thread read 24 GB/s through
//! 4 KiB pages and 32 GB/s through 2 MiB ones (a C loop over 256 MiB).
//! Where the kernel has THP off, or it is not Linux, the advice changes
//! nothing and the buffer works the same.

use bytemuck::Pod;
use std::marker::PhantomData;

/// A transparent huge page on x86-64 (and on 4 KiB-page arm64 kernels).
pub const HUGE_PAGE: usize = 2 << 20;

/// Buffers from this size get huge pages advised. A smaller one would
/// hold a 2 MiB page for a few KiB written (a short context's KV cache),
/// and the TLB covers it anyway.
const ADVISE_FROM: usize = 2 * HUGE_PAGE;

/// `len` zeroed `T`s in their own anonymous map, starting on a
/// [`HUGE_PAGE`] boundary, huge pages advised from 4 MiB. Pages are
/// allocated as they are first written, as for a zeroed `Vec`.
pub struct HugeBuf<T> {
    map: memmap2::MmapMut,
    /// Bytes from the map's start to the first element (aligned).
    offset: usize,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> HugeBuf<T> {
    /// `len` zeroed elements; the error of a refused map.
    pub fn zeroed(len: usize) -> std::io::Result<HugeBuf<T>> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .and_then(|b| b.checked_add(HUGE_PAGE))
            .ok_or_else(|| std::io::Error::other("buffer size overflows"))?;
        let map = memmap2::MmapMut::map_anon(bytes)?;
        #[cfg(target_os = "linux")]
        if bytes - HUGE_PAGE >= ADVISE_FROM {
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let addr = map.as_ptr() as usize;
        let offset = addr.next_multiple_of(HUGE_PAGE) - addr;
        Ok(HugeBuf {
            map,
            offset,
            len,
            _t: PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Pod> std::ops::Deref for HugeBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let n = self.len * size_of::<T>();
        bytemuck::cast_slice(&self.map[self.offset..self.offset + n])
    }
}

impl<T: Pod> std::ops::DerefMut for HugeBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let n = self.len * size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.map[self.offset..self.offset + n])
    }
}

impl<T: Pod> Clone for HugeBuf<T> {
    fn clone(&self) -> HugeBuf<T> {
        let mut c = HugeBuf::zeroed(self.len)
            .unwrap_or_else(|e| panic!("cannot map {} bytes: {e}", self.len * size_of::<T>()));
        c.copy_from_slice(self);
        c
    }
}

impl<T: Pod> std::fmt::Debug for HugeBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugeBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_writable() {
        for len in [0usize, 1, 7, 1000, (3 << 20) + 5] {
            let mut b = HugeBuf::<u64>::zeroed(len).unwrap();
            assert_eq!((b.len(), b.is_empty()), (len, len == 0));
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            assert!(b.iter().all(|&w| w == 0));
            for (i, w) in b.iter_mut().enumerate() {
                *w = i as u64;
            }
            let c = b.clone();
            assert!(c.iter().enumerate().all(|(i, &w)| w == i as u64));
        }
        assert!(HugeBuf::<u64>::zeroed(usize::MAX / 4).is_err());
    }
}

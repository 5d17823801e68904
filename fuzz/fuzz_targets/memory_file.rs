//! Fuzz the memory-file reader: any bytes must open to an error or to an
//! index whose blocks all read back (or fail with an error), and `verify`
//! must report rather than panic, hang or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn path() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("cachefit-fuzz-memory-{}.mem", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let p = path();
    std::fs::write(p, data).unwrap();
    if let Ok(mf) = memory::MemoryFile::open(p, None, memory::Mode::Read) {
        let g = *mf.geometry();
        let mut tokens = 0u64;
        for i in 0..mf.len_blocks() {
            let m = *mf.index().meta(i as usize);
            assert_eq!(m.first_token, tokens);
            tokens += m.n_tokens as u64;
            assert!(m.offset + g.record_len(m.n_tokens as usize) <= data.len() as u64);
            if let Ok(b) = mf.read_block(i) {
                assert_eq!(b.ids().len(), m.n_tokens as usize);
            }
        }
        assert_eq!(tokens, mf.len_tokens());
        let q = vec![0.5f32; g.slots as usize * g.dims()];
        let _ = mf.search(&q, &memory::SearchParams::default());
    }
    if let Ok(r) = memory::verify(p) {
        assert!(r.valid_blocks <= data.len() as u64);
    }
});

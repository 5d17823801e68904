//! `CACHEFIT_KERNELS` decides the kernel set the process uses. `scripts/test.sh`
//! runs this test once per set (scalar, avx2, avx512); without the variable it
//! checks auto-detection.

use kernels::isa::{self, Isa};
use kernels::matvec::{matvec, MatvecScratch, QMatrix};
use kernels::pool::ThreadPool;
use kernels::traits::{computable_types, traits};

fn expected() -> Isa {
    match std::env::var(isa::ENV_VAR) {
        Ok(v) => match Isa::from_name(&v) {
            Some(i) if i.is_supported() => i,
            _ => Isa::detect(),
        },
        Err(_) => Isa::detect(),
    }
}

#[test]
fn selected_set_follows_the_environment() {
    let want = expected();
    assert_eq!(isa::selected(), want);
    eprintln!("kernel set: {}", want.name());
    for ty in computable_types() {
        let t = traits(ty).unwrap();
        assert_eq!(
            t.vec_dot() as usize,
            (t.vec_dot_for)(want) as usize,
            "{ty}: vec_dot() is not the {} kernel",
            want.name()
        );
    }
}

#[test]
fn matvec_with_the_selected_set_matches_the_reference() {
    let pool = ThreadPool::new(2);
    let mut scratch = MatvecScratch::new();
    let (rows, cols) = (37, 512);
    let w_f32: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * if i % 61 == 0 { 9.0 } else { 1.0 })
        .collect();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 31 % 97) as f32 / 97.0) - 0.4)
        .collect();
    for ty in computable_types() {
        let t = traits(ty).unwrap();
        let rb = t.row_bytes(cols);
        let mut w = vec![0u8; rows * rb];
        for (src, dst) in w_f32.chunks(cols).zip(w.chunks_mut(rb)) {
            (t.from_float)(src, dst);
        }
        let m = QMatrix::new(ty, rows, cols, &w).unwrap();
        let mut y = vec![0f32; rows];
        matvec(&pool, &m, &x, &mut y, &mut scratch);
        let a = traits(t.vec_dot_type).unwrap();
        let mut xq = vec![0u8; a.row_bytes(cols)];
        (a.from_float)(&x, &mut xq);
        for (r, &got) in y.iter().enumerate() {
            let want = (t.vec_dot_ref)(&w[r * rb..(r + 1) * rb], &xq);
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{ty} row {r}: {got} vs reference {want} ({})",
                isa::selected().name()
            );
        }
    }
}

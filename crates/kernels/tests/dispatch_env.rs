//! The kernel set a process runs is the one it configures. `scripts/test.sh`
//! runs this test once per `CACHEFIT_KERNELS` value (scalar, avx2, avx512,
//! bogus), which it hands to `kernels::configure` the way the `cachefit`
//! CLI does (the library itself reads no environment); without the
//! variable it checks auto-detection.

use kernels::int8::I8Matrix;
use kernels::isa::{self, Isa};
use kernels::matmul::{matvec, MatmulScratch};
use kernels::matrix::QMatrix;
use kernels::pool::ThreadPool;
use kernels::traits::{computable_types, traits};
use kernels::Config;

const VAR: &str = "CACHEFIT_KERNELS";

/// What the CLI does at start-up: the named set if this CPU runs it, else
/// the best it supports. Every test calls it first; configuring the same
/// again is allowed.
fn configure_from_env() -> Isa {
    let var = std::env::var(VAR).ok();
    let isa = isa::resolve(var.as_deref()).unwrap_or_else(|_| Isa::detect());
    kernels::configure(Config { isa, tiles: true })
        .expect("nothing chose kernels before")
        .isa()
}

/// The set the variable should give, worked out independently.
fn expected() -> Isa {
    match std::env::var(VAR) {
        Ok(v) => match Isa::from_name(&v) {
            Some(i) if i.is_supported() => i,
            _ => Isa::detect(),
        },
        Err(_) => Isa::detect(),
    }
}

#[test]
fn selected_set_follows_the_configuration() {
    let want = expected();
    assert_eq!(configure_from_env(), want);
    eprintln!("kernel set: {}", want.name());
    let selected = kernels::selected();
    assert_eq!(selected.isa(), want);
    assert!(std::ptr::eq(selected, kernels::table(want).unwrap()));
    // Matrices take the selected set's kernels when they are bound.
    let w = vec![0u64; 1 << 12];
    let bytes: &[u8] = bytemuck::cast_slice(&w);
    for ty in computable_types() {
        let t = traits(ty).unwrap();
        let cols = ty
            .block_size()
            .max(traits(t.vec_dot_type).unwrap().block_size());
        let m = QMatrix::new(ty, 2, cols, &bytes[..2 * t.row_bytes(cols)]).unwrap();
        assert_eq!(m.kernels().isa(), want, "{ty}");
    }
    let (q, s) = ([1i8; 64], [1.0f32; 2]);
    let m = I8Matrix::new(2, 32, &q, &s).unwrap();
    assert_eq!(m.is_packed(), selected.int8.pack);
    assert_eq!(m.is_packed(), want == Isa::Avx512);
    // Row tiles where that set's kernels make them pay.
    assert_eq!(
        kernels::quant::tiles::wanted(),
        matches!(want, Isa::Avx2 | Isa::Avx512)
    );
    // Once chosen, the choice stays.
    let other = Config {
        isa: want,
        tiles: false,
    };
    assert!(kernels::configure(other).is_err());
    assert_eq!(kernels::config().isa, want);
}

#[test]
fn matvec_with_the_selected_set_matches_the_reference() {
    let want = configure_from_env();
    let pool = ThreadPool::new(2);
    let mut scratch = MatmulScratch::new();
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
            let reference = (t.vec_dot_ref)(&w[r * rb..(r + 1) * rb], &xq);
            assert!(
                (got - reference).abs() <= 1e-4 * reference.abs().max(1.0),
                "{ty} row {r}: {got} vs reference {reference} ({})",
                want.name()
            );
        }
    }
}

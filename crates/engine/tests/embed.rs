//! Embeddings on a real model (SmolLM2-135M Q4_1): each pooling against
//! the hidden states a state gives directly, normalized; the same vector
//! whatever the batch size the text is read in; clear errors.

use engine::embed::{EmbedError, Embedder, Pooling};
use gguf::GgufFile;
use kernels::pool::ThreadPool;
use model::{Logits, Model, ModelConfig, StateOptions};
use tokenize::Vocab;

fn unit(v: &[f64]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| (x / n) as f32).collect()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() < 1e-5, "dim {i}: {x} vs {y}");
    }
}

#[test]
fn pooled_states_match_the_state_s_own() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let vocab = Vocab::from_gguf(file.metadata()).unwrap();
    let tokens = vocab.encode("The quick brown fox jumps over the lazy dog.", true, false);
    let dim = cfg.dim;

    // Every token's normed hidden state, read in one batch.
    let pool = ThreadPool::new(1);
    let mut state = model.new_state(&StateOptions::new(64)).unwrap();
    state.set_embeddings(true).unwrap();
    state.forward_seq(&pool, &tokens, 0, Logits::All);
    let rows: Vec<Vec<f64>> = state
        .embeddings()
        .chunks_exact(dim)
        .map(|r| r.iter().map(|&x| x as f64).collect())
        .collect();
    assert_eq!(rows.len(), tokens.len());
    let mean: Vec<f64> = (0..dim)
        .map(|i| rows.iter().map(|r| r[i]).sum::<f64>() / rows.len() as f64)
        .collect();

    for (pooling, want) in [
        (Pooling::Mean, unit(&mean)),
        (Pooling::First, unit(&rows[0])),
        (Pooling::Last, unit(rows.last().unwrap())),
    ] {
        // Batches of 64 (one call) and of 4 (several): the same vector.
        for n_batch in [64, 4] {
            let opts = StateOptions {
                n_batch,
                ..StateOptions::new(64)
            };
            let mut e = Embedder::new(&model, opts, pooling, 1);
            let got = e.embed(&tokens).unwrap();
            close(&got, &want);
            let norm: f32 = got.iter().map(|x| x * x).sum();
            assert!((norm - 1.0).abs() < 1e-5);
            // Again on the same state: the same.
            assert_eq!(e.embed(&tokens).unwrap(), got, "{pooling:?} {n_batch}");
        }
    }

    let mut e = Embedder::new(&model, StateOptions::new(8), Pooling::Mean, 1);
    assert_eq!(e.embed(&[]), Err(EmbedError::Empty));
    assert_eq!(
        e.embed(&tokens),
        Err(EmbedError::TooLong {
            tokens: tokens.len(),
            n_ctx: 8
        })
    );
}

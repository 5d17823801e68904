//! `State::copy_seq` on a llama-family model (SmolLM2): a sequence given
//! another's prefix continues with the same bits as the original, for
//! every cache type. (The `cachefit` architecture, whose convolution
//! inputs are copied too, is tested in tests/cachefit.rs.)

use gguf::GgufFile;
use kernels::pool::ThreadPool;
use model::{KvType, Model, ModelConfig, StateOptions, Token};

#[test]
fn a_copied_sequence_continues_exactly() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(file.metadata()).unwrap();
    let model = Model::from_gguf(&file, &cfg).unwrap();
    let pool = ThreadPool::new(1);
    let prompt: Vec<u32> = (0..9).map(|i| 300 + i * 17).collect();
    let stale: Vec<u32> = (0..14).map(|i| 900 + i * 5).collect();
    let more = [1000u32, 2000, 3000];
    for kv_type in [KvType::F16, KvType::Q8_0, KvType::F32] {
        let o = StateOptions {
            n_seq: 2,
            n_batch: 16,
            kv_type,
            ..StateOptions::new(32)
        };
        let mut s = model.new_state(&o).unwrap();
        for (seq, ids) in [(0, &prompt[..]), (1, &stale[..])] {
            let toks: Vec<Token> = ids
                .iter()
                .enumerate()
                .map(|(pos, &id)| Token {
                    id,
                    seq,
                    pos,
                    logits: pos + 1 == ids.len(),
                })
                .collect();
            s.forward(&pool, &toks);
        }
        s.copy_seq(0, 1, 0..prompt.len());
        for (i, &id) in more.iter().enumerate() {
            let both: Vec<Token> = (0..2)
                .map(|seq| Token {
                    id,
                    seq,
                    pos: prompt.len() + i,
                    logits: true,
                })
                .collect();
            let out = s.forward(&pool, &both);
            let v = cfg.vocab_size;
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out[..v]), bits(&out[v..]), "{kv_type} token {i}");
        }
    }
}

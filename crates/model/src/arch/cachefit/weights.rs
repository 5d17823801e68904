//! A `cachefit` file's tensors bound in place (docs/CACHEFIT-FORMAT.md,
//! "Tensors"). A matrix `NAME` is `NAME.weight` of type I8 plus its
//! per-row `NAME.scale` (F32), or `NAME.weight` alone in a float or ggml
//! block type the kernels compute with (F32 as the exporter writes it;
//! TQ2_0 block matrices of a ternary network, repacked for the ternary
//! kernels).

use crate::binder::Binder;
use crate::config::{BlockKind, ModelConfig, TokenCodes};
use crate::Error;
use gguf::GgmlType;
use kernels::int8::{self, I8Matrix, I8Vector};
use kernels::matmul::{matvec, MatmulScratch};
use kernels::matrix::QMatrix;
use kernels::pool::ThreadPool;
use kernels::quant::q8_k::BlockQ8K;
use kernels::ternary::{self, TernaryMatrix};
use std::borrow::Cow;

/// Tokens whose activations go through a matrix together: the int8
/// kernels read each weight once for all of them (two activations each).
pub const TOKENS_PER_PASS: usize = 4;

/// Up to [`TOKENS_PER_PASS`] activation vectors in the form the int8
/// kernels read, each as two int8 vectors: `x ≈ s_hi·q_hi + s_lo·q_lo`,
/// `q_hi` the usual per-vector quantization and `q_lo` that of what it
/// leaves over (at most `s_hi/2` per element). About 15 bits per value:
/// with 8 the runtime's greedy choice differed from the float reference's
/// at ~1% of steps on the shipped model (near-ties of a high-entropy
/// model), with the pair at <0.1%. Costs two integer dot products per row,
/// both exact, from one read of the weights.
///
/// Ternary matrices read another form: Q8_K blocks, also as a pair
/// (`x ≈ q8k(x) + q8k(rest)`, ~15 bits: with one Q8_K vector a float
/// difference far below the trainer's precision can move a value across a
/// rounding step, and greedy choices parted from the trainer's at ~0.4% of
/// steps). Each form is made on first use after
/// [`Activations::quantize`], so an input read only by ternary matrices
/// never pays for the int8 pair, nor one read only by int8 ones for Q8_K.
pub struct Activations {
    hi: Vec<I8Vector>,
    lo: Vec<I8Vector>,
    /// Per token, `cols / 256` Q8_K blocks, and those of what they leave.
    q8k: Vec<Vec<BlockQ8K>>,
    q8k_lo: Vec<Vec<BlockQ8K>>,
    /// Tokens of the last [`Activations::quantize`].
    n: usize,
    /// Which forms are up to date with it.
    pairs_ready: bool,
    q8k_ready: bool,
    /// Scratch: what `hi` leaves over.
    rest: Vec<f32>,
}

impl Activations {
    /// For vectors up to `cols` long (the outputs go straight to the
    /// caller's buffers: nothing depends on the matrices' rows).
    pub fn with_capacity(cols: usize) -> Activations {
        let v = || {
            (0..TOKENS_PER_PASS)
                .map(|_| I8Vector::with_capacity(cols))
                .collect()
        };
        let blocks = cols.div_ceil(gguf::QK_K);
        let zero = <BlockQ8K as bytemuck::Zeroable>::zeroed();
        Activations {
            hi: v(),
            lo: v(),
            q8k: (0..TOKENS_PER_PASS).map(|_| vec![zero; blocks]).collect(),
            q8k_lo: (0..TOKENS_PER_PASS).map(|_| vec![zero; blocks]).collect(),
            n: 0,
            pairs_ready: false,
            q8k_ready: false,
            rest: vec![0.0; cols],
        }
    }

    /// Take the rows of `xs`, `(n, cols)` with `n <=` [`TOKENS_PER_PASS`],
    /// as the next input: the products that follow read them (each form
    /// quantized once, when first needed).
    pub fn quantize(&mut self, xs: &[f32], cols: usize) {
        let n = xs.len() / cols;
        assert!(
            n * cols == xs.len() && n <= TOKENS_PER_PASS,
            "Activations::quantize: {} values are not up to {TOKENS_PER_PASS} rows of {cols}",
            xs.len()
        );
        self.n = n;
        self.pairs_ready = false;
        self.q8k_ready = false;
    }

    /// The int8 pairs of `xs` (the rows given to the last `quantize`).
    fn pairs(&mut self, xs: &[f32], cols: usize) {
        if self.pairs_ready {
            return;
        }
        if self.rest.len() < cols {
            self.rest.resize(cols, 0.0);
        }
        for ((x, hi), lo) in xs.chunks_exact(cols).zip(&mut self.hi).zip(&mut self.lo) {
            int8::quantize_pair(x, hi, lo, &mut self.rest);
        }
        self.pairs_ready = true;
    }

    /// The Q8_K pair of `xs` (`cols` a multiple of 256).
    fn q8k(&mut self, xs: &[f32], cols: usize) {
        if self.q8k_ready {
            return;
        }
        let blocks = cols / gguf::QK_K;
        let zero = <BlockQ8K as bytemuck::Zeroable>::zeroed();
        if self.rest.len() < cols {
            self.rest.resize(cols, 0.0);
        }
        let rest = &mut self.rest[..cols];
        for ((x, hi), lo) in xs
            .chunks_exact(cols)
            .zip(&mut self.q8k)
            .zip(&mut self.q8k_lo)
        {
            hi.resize(blocks, zero);
            lo.resize(blocks, zero);
            ternary::quantize_activation(x, &mut hi[..blocks]);
            // What `hi` leaves: x − d·q, exactly as the dequantizer gives it.
            for ((r, v), b) in rest
                .chunks_exact_mut(gguf::QK_K)
                .zip(x.chunks_exact(gguf::QK_K))
                .zip(&hi[..blocks])
            {
                for ((r, &v), &q) in r.iter_mut().zip(v).zip(&b.qs) {
                    *r = v - b.d * q as f32;
                }
            }
            ternary::quantize_activation(rest, &mut lo[..blocks]);
        }
        self.q8k_ready = true;
    }
}

/// A weight matrix in either storage.
pub enum Matrix<'a> {
    /// Int8 rows with one scale each: the int8 kernels.
    Int8(I8Matrix<'a>),
    /// Any type with ggml-style kernels (F32 in practice).
    Float(QMatrix<'a>),
    /// TQ2_0 rows repacked for the ternary kernels.
    Ternary(TernaryMatrix),
}

impl Matrix<'_> {
    pub fn rows(&self) -> usize {
        match self {
            Matrix::Int8(m) => m.rows(),
            Matrix::Float(m) => m.rows(),
            Matrix::Ternary(m) => m.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Matrix::Int8(m) => m.cols(),
            Matrix::Float(m) => m.cols(),
            Matrix::Ternary(m) => m.cols(),
        }
    }

    /// Bytes one matrix-vector product reads.
    pub fn bytes(&self) -> usize {
        match self {
            Matrix::Int8(m) => m.bytes(),
            Matrix::Float(m) => m.data().len(),
            Matrix::Ternary(m) => m.bytes(),
        }
    }

    /// Row `r` as floats (an embedding lookup). Only the embedding is
    /// read by row, and it is never bound as ternary.
    pub fn row(&self, r: usize, out: &mut [f32]) {
        match self {
            Matrix::Int8(m) => m.dequantize_row(r, out),
            Matrix::Float(m) => (m.traits().to_float)(m.row(r), out),
            Matrix::Ternary(_) => unreachable!("a ternary matrix read by row"),
        }
    }

    /// `y_t = M x_t` for the rows of `xs` (`(n, cols)` → `ys`, `(n,
    /// rows)`): int8 matrices read `xq`, the int8 form of `xs` (quantized
    /// by the caller once for all matrices that read it); float matrices
    /// read `xs` itself. `y = y_hi + y_lo`, each exactly as a
    /// single-activation product gives it.
    pub fn matvecs(
        &self,
        pool: &ThreadPool,
        xs: &[f32],
        xq: &mut Activations,
        ys: &mut [f32],
        scratch: &mut MatmulScratch,
    ) {
        let (rows, cols) = (self.rows(), self.cols());
        // The quantized forms hold `xq.n` rows of what `xs` holds.
        let n = xq.n;
        let quantized = !matches!(self, Matrix::Float(_));
        assert!(
            !quantized || (xs.len() == n * cols && ys.len() == n * rows),
            "Matrix::matvecs: {n} quantized rows, {} inputs, {} outputs",
            xs.len(),
            ys.len()
        );
        match self {
            Matrix::Int8(m) => {
                xq.pairs(xs, cols);
                let Activations { hi, lo, .. } = xq;
                // (hi₀, lo₀, hi₁, lo₁, …): one pass over the weights for
                // all of them, each pair's two products added in the kernel.
                let acts: [&I8Vector; 2 * TOKENS_PER_PASS] =
                    std::array::from_fn(|i| if i % 2 == 0 { &hi[i / 2] } else { &lo[i / 2] });
                int8::matvec_pairs(pool, m, &acts[..2 * n], ys);
            }
            Matrix::Float(m) => {
                for (x, y) in xs.chunks_exact(cols).zip(ys.chunks_exact_mut(rows)) {
                    matvec(pool, m, x, y, scratch);
                }
            }
            Matrix::Ternary(m) => {
                xq.q8k(xs, cols);
                let Activations { q8k, q8k_lo, .. } = xq;
                // One pass over the weights for both halves of the pair,
                // the same bits as two products added.
                for ((hi, lo), y) in q8k.iter().zip(q8k_lo.iter()).zip(ys.chunks_exact_mut(rows)) {
                    m.matvec_pair(pool, hi, lo, y);
                }
            }
        }
    }
}

/// The token mixer of a block.
pub enum Mixer<'a> {
    Conv {
        gate: Matrix<'a>, // (dim, dim)
        /// `(K, dim)`: tap `k` of channel `j` at `k·dim + j` (the file's
        /// `(dim, K)` transposed, so a tap is applied to a whole row).
        taps: Vec<f32>,
        out: Matrix<'a>, // (dim, dim)
    },
    Attn {
        qkv: Matrix<'a>, // (q_dim + 2·kv_dim, dim): q heads, k heads, v heads
        out: Matrix<'a>, // (dim, q_dim)
    },
}

pub struct Block<'a> {
    pub attn_norm: Cow<'a, [f32]>, // (dim,)
    pub mixer: Mixer<'a>,
    pub ffn_norm: Cow<'a, [f32]>, // (dim,)
    pub ffn_gate: Matrix<'a>,     // (ffn_dim, dim)
    pub ffn_up: Matrix<'a>,       // (ffn_dim, dim)
    pub ffn_down: Matrix<'a>,     // (dim, ffn_dim)
}

/// How a token becomes the first residual vector.
pub enum Input<'a> {
    /// A row of the embedding table, which is also the output head.
    Tied,
    /// `proj · code(token)`: `proj` is `(dim, bits)`, the code the token's
    /// fixed ±1 string ([`crate::token_codes`]).
    Codes { proj: Matrix<'a>, codes: TokenCodes },
}

pub struct Weights<'a> {
    /// The output head, `(vocab, dim)`: `token_embd` (tied to the input)
    /// or, with token codes, `output`.
    pub head: Matrix<'a>,
    pub input: Input<'a>,
    pub blocks: Vec<Block<'a>>,
    pub output_norm: Cow<'a, [f32]>, // (dim,)
    /// Taps of each convolution, `K`.
    pub conv_kernel: usize,
    /// Logit soft cap, 0 for none.
    pub softcap: f32,
}

impl<'a> Weights<'a> {
    pub(crate) fn from_binder(b: &Binder<'a>, cfg: &ModelConfig) -> Result<Weights<'a>, Error> {
        let Some(cf) = &cfg.cachefit else {
            return Err(Error::BadValue {
                key: "cachefit.block_pattern".into(),
                problem: "the config has no cachefit section (not read from a cachefit file?)"
                    .into(),
            });
        };
        let (d, f, k) = (cfg.dim, cfg.ffn_dim, cf.conv_kernel);
        let qkv_rows = cfg.q_dim() + 2 * cfg.kv_dim();
        let mut blocks = Vec::with_capacity(cf.blocks.len());
        for (i, &kind) in cf.blocks.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let mixer = match kind {
                BlockKind::Conv => Mixer::Conv {
                    gate: block_matrix(b, &n("conv_gate"), d, d)?,
                    taps: taps(b, &n("conv_taps.weight"), d, k)?,
                    out: block_matrix(b, &n("conv_out"), d, d)?,
                },
                BlockKind::Attn => Mixer::Attn {
                    qkv: block_matrix(b, &n("attn_qkv"), qkv_rows, d)?,
                    out: block_matrix(b, &n("attn_output"), d, cfg.q_dim())?,
                },
            };
            blocks.push(Block {
                attn_norm: b.vector(&n("attn_norm.weight"), d)?,
                mixer,
                ffn_norm: b.vector(&n("ffn_norm.weight"), d)?,
                ffn_gate: block_matrix(b, &n("ffn_gate"), f, d)?,
                ffn_up: block_matrix(b, &n("ffn_up"), f, d)?,
                ffn_down: block_matrix(b, &n("ffn_down"), d, f)?,
            });
        }
        let (head, input) = match cf.token_codes {
            None => (matrix(b, "token_embd", cfg.vocab_size, d)?, Input::Tied),
            Some(codes) => (
                matrix(b, "output", cfg.vocab_size, d)?,
                Input::Codes {
                    proj: matrix(b, "token_proj", d, codes.bits)?,
                    codes,
                },
            ),
        };
        Ok(Weights {
            head,
            input,
            blocks,
            output_norm: b.vector("output_norm.weight", d)?,
            conv_kernel: k,
            softcap: cf.softcap,
        })
    }

    /// Blocks of each kind: (convolution, attention).
    pub fn n_blocks(&self) -> (usize, usize) {
        let conv = (self.blocks.iter())
            .filter(|b| matches!(b.mixer, Mixer::Conv { .. }))
            .count();
        (conv, self.blocks.len() - conv)
    }

    /// Bytes of weights one token reads: every matrix, the tied embedding
    /// once (as the output head; a row read as the input is negligible).
    pub fn bytes_per_token(&self) -> usize {
        let mut n = self.head.bytes();
        if let Input::Codes { proj, .. } = &self.input {
            n += proj.bytes();
        }
        for bl in &self.blocks {
            let (a, b) = match &bl.mixer {
                Mixer::Conv { gate, out, .. } => (gate, out),
                Mixer::Attn { qkv, out } => (qkv, out),
            };
            for m in [a, b, &bl.ffn_gate, &bl.ffn_up, &bl.ffn_down] {
                n += m.bytes();
            }
        }
        n
    }
}

/// The `(dim, K)` taps (GGUF dims `[K, dim]`, K fastest), as `(K, dim)`.
fn taps(b: &Binder<'_>, name: &str, d: usize, k: usize) -> Result<Vec<f32>, Error> {
    let (info, data) = b.tensor(name)?;
    let bad = |problem: String| Error::Tensor {
        name: name.to_string(),
        problem,
    };
    if info.dims != [k as u64, d as u64] {
        return Err(bad(format!("shape {:?}, expected [{k}, {d}]", info.dims)));
    }
    if info.ty != GgmlType::F32 {
        return Err(bad(format!("type {}, expected F32", info.ty)));
    }
    let t: &[f32] =
        bytemuck::try_cast_slice(data).map_err(|e| bad(format!("F32 data not castable: {e}")))?;
    let mut out = vec![0.0; d * k];
    for j in 0..d {
        for tap in 0..k {
            out[tap * d + j] = t[j * k + tap];
        }
    }
    Ok(out)
}

/// A block's matrix: as [`matrix`], and a TQ2_0 one repacked for the
/// ternary kernels (kept as stored when only planning the budget).
fn block_matrix<'a>(
    b: &Binder<'a>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Matrix<'a>, Error> {
    let m = matrix(b, name, rows, cols)?;
    // The repacked kernels are x86 SIMD; elsewhere (NEON, scalar) the
    // generic TQ2_0 dots are the faster ones.
    let simd = matches!(
        kernels::selected().isa(),
        kernels::isa::Isa::Avx2 | kernels::isa::Isa::Avx512
    );
    match m {
        Matrix::Float(q) if q.ty() == GgmlType::TQ2_0 && simd => {
            let wname = format!("{name}.weight");
            Ok(match b.ternary(&wname, &q)? {
                Some(t) => Matrix::Ternary(t),
                None => Matrix::Float(q),
            })
        }
        m => Ok(m),
    }
}

/// The matrix `name` (`name.weight`, plus `name.scale` when I8), `rows ×
/// cols`.
fn matrix<'a>(b: &Binder<'a>, name: &str, rows: usize, cols: usize) -> Result<Matrix<'a>, Error> {
    let wname = format!("{name}.weight");
    let sname = format!("{name}.scale");
    let (info, data) = b.tensor(&wname)?;
    let has_scale = b.file.tensor_info(&sname).is_some();
    if info.ty != GgmlType::I8 {
        if has_scale {
            return Err(Error::Tensor {
                name: sname,
                problem: format!("scales an I8 matrix, but `{wname}` is {}", info.ty),
            });
        }
        return b.matrix(&wname, rows, cols).map(Matrix::Float);
    }
    let bad = |name: &str, problem: String| Error::Tensor {
        name: name.to_string(),
        problem,
    };
    if info.dims != [cols as u64, rows as u64] {
        return Err(bad(
            &wname,
            format!("shape {:?}, expected [{cols}, {rows}]", info.dims),
        ));
    }
    if !has_scale {
        return Err(bad(
            &sname,
            format!("missing from the file (`{wname}` is I8 and needs one F32 scale per row)"),
        ));
    }
    let (sinfo, sdata) = b.tensor(&sname)?;
    if sinfo.ty != GgmlType::F32 {
        return Err(bad(&sname, format!("type {}, expected F32", sinfo.ty)));
    }
    if sinfo.dims != [rows as u64] {
        return Err(bad(
            &sname,
            format!("shape {:?}, expected [{rows}]", sinfo.dims),
        ));
    }
    let scales: &'a [f32] = bytemuck::try_cast_slice(sdata)
        .map_err(|e| bad(&sname, format!("F32 data not castable: {e}")))?;
    let q: &'a [i8] = bytemuck::cast_slice(data);
    I8Matrix::new(rows, cols, q, scales)
        .map(Matrix::Int8)
        .map_err(|e| bad(&wname, e.to_string()))
}

//! The instruction sets the SIMD kernels are written for, which of them
//! this CPU runs, and `PerIsa`, how a kernel family lists its variants.
//!
//! Soundness rests on one rule: a kernel compiled for a set (with
//! `#[target_feature]`) is only ever called on a CPU whose
//! [`Isa::is_supported`] is true for that set. Kernels reach their callers
//! only through `PerIsa::get`, an `unsafe fn` whose caller promises
//! exactly that, and its one caller, [`crate::dispatch`], builds a table
//! only for a supported set. So a baseline x86-64 binary on a CPU without
//! AVX2 runs the scalar kernels instead of dying on an illegal instruction.

/// A set of SIMD instructions the kernels are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, every CPU.
    Scalar = 0,
    /// x86-64 AVX2 + FMA + F16C (Haswell, Zen 1 and later).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/DQ plus VNNI (Ice Lake, Zen 4 and later);
    /// implies everything in [`Isa::Avx2`].
    Avx512,
    /// AArch64 NEON (baseline on every 64-bit ARM CPU) with dot-product
    /// instructions where kernels say so.
    Neon,
}

impl Isa {
    /// Every set, in discriminant order (`ALL[isa as usize] == isa`).
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL
            .iter()
            .copied()
            .find(|i| i.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether the running CPU can execute kernels written for this set.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_supported()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best set the running CPU supports.
    pub fn detect() -> Isa {
        [Isa::Avx512, Isa::Avx2, Isa::Neon]
            .into_iter()
            .find(|i| i.is_supported())
            .unwrap_or(Isa::Scalar)
    }

    /// Every set the running CPU supports, scalar first (for tests).
    pub fn supported() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }
}

/// Why a requested kernel set cannot be used. The messages read as the
/// continuation of `NAME=` (the caller knows where the request came from:
/// `cachefit` prints `CACHEFIT_KERNELS=` before them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForceError {
    Unknown(String),
    Unsupported(Isa),
}

impl std::fmt::Display for ForceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForceError::Unknown(s) => write!(
                f,
                "{s:?} is not a kernel set (expected one of scalar, avx2, avx512, neon)"
            ),
            ForceError::Unsupported(i) => {
                write!(f, "{} asks for kernels this CPU cannot run", i.name())
            }
        }
    }
}

impl std::error::Error for ForceError {}

/// The set a request names: `None`, empty or `auto` for the best the CPU
/// supports, else a set's name ([`Isa::name`], any case), which the CPU
/// must support.
pub fn resolve(requested: Option<&str>) -> Result<Isa, ForceError> {
    match requested {
        None => Ok(Isa::detect()),
        Some(s) if s.trim().is_empty() || s.trim().eq_ignore_ascii_case("auto") => {
            Ok(Isa::detect())
        }
        Some(s) => {
            let isa = Isa::from_name(s).ok_or_else(|| ForceError::Unknown(s.to_string()))?;
            if isa.is_supported() {
                Ok(isa)
            } else {
                Err(ForceError::Unsupported(isa))
            }
        }
    }
}

/// One value per instruction set — a kernel, or a family's table of
/// kernels — each only sound to call on a CPU with that set. A set without
/// an entry of its own falls back: AVX-512 to AVX2 (which it implies), the
/// others to the scalar entry.
#[derive(Clone, Copy)]
pub(crate) struct PerIsa<T> {
    scalar: T,
    avx2: Option<T>,
    avx512: Option<T>,
    /// Preferred over `avx512` on CPUs that also have AVX512_BF16 (Zen 4,
    /// Sapphire Rapids): the one sub-feature a kernel is written for.
    avx512_bf16: Option<T>,
    neon: Option<T>,
}

impl<T: Copy> PerIsa<T> {
    /// The scalar entry, used by every set until another is given.
    pub(crate) const fn new(scalar: T) -> PerIsa<T> {
        PerIsa {
            scalar,
            avx2: None,
            avx512: None,
            avx512_bf16: None,
            neon: None,
        }
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn avx2(self, entry: T) -> PerIsa<T> {
        PerIsa {
            avx2: Some(entry),
            ..self
        }
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn avx512(self, entry: T) -> PerIsa<T> {
        PerIsa {
            avx512: Some(entry),
            ..self
        }
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn avx512_bf16(self, entry: T) -> PerIsa<T> {
        PerIsa {
            avx512_bf16: Some(entry),
            ..self
        }
    }
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(crate) const fn neon(self, entry: T) -> PerIsa<T> {
        PerIsa {
            neon: Some(entry),
            ..self
        }
    }

    /// The entry for `isa`.
    ///
    /// # Safety
    /// The CPU must support `isa` ([`Isa::is_supported`]): the entry may run
    /// that set's instructions, and safe code may call it.
    pub(crate) unsafe fn get(&self, isa: Isa) -> T {
        let avx2 = self.avx2.unwrap_or(self.scalar);
        match isa {
            Isa::Scalar => self.scalar,
            Isa::Avx2 => avx2,
            Isa::Avx512 => match self.avx512_bf16 {
                Some(entry) if has_avx512_bf16() => entry,
                _ => self.avx512.unwrap_or(avx2),
            },
            Isa::Neon => self.neon.unwrap_or(self.scalar),
        }
    }
}

fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512bf16");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_is_always_supported_and_detect_is_supported() {
        assert!(Isa::Scalar.is_supported());
        assert!(Isa::detect().is_supported());
        assert_eq!(Isa::supported()[0], Isa::Scalar);
    }

    #[test]
    fn all_is_in_discriminant_order() {
        for (i, isa) in Isa::ALL.into_iter().enumerate() {
            assert_eq!(isa as usize, i);
        }
    }

    /// A set without an entry falls back: AVX-512 to AVX2, the others to
    /// scalar; AVX512_BF16 wins on AVX-512 only where the CPU has it.
    #[test]
    fn per_isa_fallbacks() {
        let all = |p: &PerIsa<u8>| -> Vec<u8> {
            // SAFETY: only reads the entries (plain numbers, nothing runs).
            Isa::ALL.map(|i| unsafe { p.get(i) }).to_vec()
        };
        let scalar = PerIsa::new(0u8);
        assert_eq!(all(&scalar), [0, 0, 0, 0]);
        assert_eq!(all(&scalar.avx2(1)), [0, 1, 1, 0]);
        assert_eq!(all(&scalar.avx2(1).avx512(2).neon(3)), [0, 1, 2, 3]);
        assert_eq!(all(&scalar.avx512(2)), [0, 0, 2, 0]);
        let bf16 = scalar.avx2(1).avx512(2).avx512_bf16(4);
        assert_eq!(all(&bf16)[2], if has_avx512_bf16() { 4 } else { 2 });
    }

    #[test]
    fn resolve_names() {
        assert_eq!(resolve(Some("scalar")), Ok(Isa::Scalar));
        assert_eq!(resolve(Some(" SCALAR ")), Ok(Isa::Scalar));
        assert_eq!(resolve(None), Ok(Isa::detect()));
        assert_eq!(resolve(Some("auto")), Ok(Isa::detect()));
        assert!(matches!(resolve(Some("sse9")), Err(ForceError::Unknown(_))));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            resolve(Some("neon")),
            Err(ForceError::Unsupported(Isa::Neon))
        );
    }
}

//! Instruction-set selection for the SIMD kernels.
//!
//! Soundness rests on one rule: a SIMD kernel is only ever handed out for an
//! [`Isa`] whose [`Isa::is_supported`] is true on the running CPU. Every
//! `vec_dot_kernel(isa)` in `quant` checks it, so a baseline x86-64 binary run
//! on a CPU without AVX2 gets the scalar path instead of an illegal
//! instruction.

use std::sync::OnceLock;

/// A set of SIMD instructions the kernels are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, every CPU.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C (Haswell, Zen 1 and later).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/DQ plus VNNI (Ice Lake, Zen 4 and later);
    /// implies everything in [`Isa::Avx2`].
    Avx512,
    /// AArch64 NEON (baseline on every 64-bit ARM CPU) with dot-product
    /// instructions where kernels say so.
    Neon,
}

/// Name of the environment variable that forces a kernel set.
pub const ENV_VAR: &str = "CACHEFIT_KERNELS";

impl Isa {
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

/// Why a forced kernel set was not used.
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
                "{ENV_VAR}={s:?} is not a kernel set (expected one of scalar, avx2, avx512, neon)"
            ),
            ForceError::Unsupported(i) => write!(
                f,
                "{ENV_VAR}={} asks for kernels this CPU cannot run",
                i.name()
            ),
        }
    }
}

impl std::error::Error for ForceError {}

/// Resolve a requested kernel set name (the value of [`ENV_VAR`]).
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

static SELECTED: OnceLock<Isa> = OnceLock::new();

/// The kernel set this process uses, decided once: [`ENV_VAR`] if set and
/// usable, otherwise the best the CPU supports. A bad override is reported on
/// stderr once and ignored.
pub fn selected() -> Isa {
    *SELECTED.get_or_init(|| {
        let var = std::env::var(ENV_VAR).ok();
        match resolve(var.as_deref()) {
            Ok(isa) => isa,
            Err(e) => {
                let isa = Isa::detect();
                eprintln!("cachefit: {e}; using {}", isa.name());
                isa
            }
        }
    })
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

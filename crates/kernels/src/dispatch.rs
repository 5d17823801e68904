//! Which kernels run: one table of function pointers per instruction set
//! ([`Kernels`]), built the first time it is asked for and then kept
//! (memchr's idiom: detect on first use, cache), and the one table this
//! process uses ([`selected`]).
//!
//! A table exists only for a set the CPU supports — [`table`] returns
//! `None` for the others — so holding a `&Kernels` is proof that every
//! function in it may be called. That is the invariant the SIMD wrappers'
//! `unsafe` blocks rest on (see [`crate::isa`]). Tests ask for each
//! supported set's table and hold its kernels to the scalar twins.
//!
//! Nothing here reads the environment. A program chooses once at start-up
//! with [`configure`] (the `cachefit` CLI maps `CACHEFIT_KERNELS` and
//! `CACHEFIT_TILES` onto it); without that, the first use selects the
//! best set the CPU supports, with row tiles on.
//!
//! Matrices go further: a [`crate::matrix::QMatrix`] or
//! [`crate::int8::I8Matrix`] takes its kernel from the table when it is
//! bound, so a product looks nothing up.

use crate::int8::Int8Kernels;
use crate::isa::Isa;
use crate::ops::RowKernels;
use crate::quant::f16::F16Kernels;
use crate::quant::q8_0::ActivationFn;
use crate::quant::tiles::TileDotFn;
use crate::traits::{traits, MultiDotFn, VecDotFn};
use crate::vecops::VecKernels;
use gguf::GgmlType;
use std::fmt;
use std::sync::OnceLock;

/// Slots of the per-type arrays: one per ggml type id.
const TYPE_SLOTS: usize = 40;
const _: () = {
    let mut i = 0;
    while i < GgmlType::ALL.len() {
        assert!((GgmlType::ALL[i] as usize) < TYPE_SLOTS);
        i += 1;
    }
};

/// Every kernel of one instruction set. Only [`table`] makes one, and only
/// for a set the CPU supports.
pub struct Kernels {
    isa: Isa,
    /// Element-wise ops and attention ([`crate::vecops`]).
    pub vecops: VecKernels,
    /// Attention's loops over cached positions ([`crate::ops::dot_rows`]).
    pub rows: RowKernels,
    /// The int8 matrices of the cachefit architecture ([`crate::int8`]).
    pub int8: Int8Kernels,
    /// Bulk f32 ↔ f16 rows (the KV cache; [`crate::quant::f16`]).
    pub f16: F16Kernels,
    /// ggml-cpu's run-time Q8_0 quantizer
    /// ([`crate::quant::q8_0::quantize_row_activation`]).
    pub q8_0_activation: ActivationFn,
    /// Activations prepared for the row tiles ([`crate::quant::tiles::prepare`]).
    pub tile_prepare: crate::traits::FromFloatFn,
    /// The bandwidth probes' reduction, with this set's widest loads
    /// ([`crate::bandwidth`]).
    pub(crate) read_sum: fn(&[u64]) -> u64,
    vec_dot: [Option<VecDotFn>; TYPE_SLOTS],
    multi_dot: [Option<MultiDotFn>; TYPE_SLOTS],
    tile_dot: [Option<TileDotFn>; TYPE_SLOTS],
}

impl Kernels {
    /// # Safety
    /// The CPU must support `isa`: every entry may use its instructions.
    unsafe fn new(isa: Isa) -> Kernels {
        // SAFETY: (every `get` below) the caller guarantees the CPU
        // supports `isa`.
        let mut k = unsafe {
            Kernels {
                isa,
                vecops: crate::vecops::KERNELS.get(isa),
                rows: crate::ops::ROW_KERNELS.get(isa),
                int8: crate::int8::KERNELS.get(isa),
                f16: crate::quant::f16::KERNELS.get(isa),
                q8_0_activation: crate::quant::q8_0::ACTIVATION.get(isa),
                tile_prepare: crate::quant::tiles::PREPARE.get(isa),
                read_sum: crate::bandwidth::READ_SUM.get(isa),
                vec_dot: [None; TYPE_SLOTS],
                multi_dot: [None; TYPE_SLOTS],
                tile_dot: [None; TYPE_SLOTS],
            }
        };
        for ty in GgmlType::ALL {
            let i = ty as usize;
            if let Some(t) = traits(ty) {
                // SAFETY: as above.
                k.vec_dot[i] = Some(unsafe { t.dots.get(isa) });
                // SAFETY: as above.
                k.multi_dot[i] = t.multi.map(|m| unsafe { m.dots.get(isa) });
            }
            // SAFETY: as above.
            k.tile_dot[i] = crate::quant::tiles::tile_dot(ty).map(|t| unsafe { t.dots.get(isa) });
        }
        k
    }

    /// The instruction set these kernels are written for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The dot product of weight type `ty` against its activation type
    /// (`None` if the type has no kernels).
    pub fn vec_dot(&self, ty: GgmlType) -> Option<VecDotFn> {
        self.vec_dot[ty as usize]
    }

    /// The several-activation dot of `ty`, for the types that have one
    /// ([`crate::traits::MultiDot`]).
    pub fn multi_dot(&self, ty: GgmlType) -> Option<MultiDotFn> {
        self.multi_dot[ty as usize]
    }

    /// The row-tile kernel of `ty`, for the types that have one
    /// ([`crate::quant::tiles`]).
    pub fn tile_dot(&self, ty: GgmlType) -> Option<TileDotFn> {
        self.tile_dot[ty as usize]
    }

    /// Whether repacking weights into row tiles pays with these kernels:
    /// only the SIMD tile kernels are faster than the row-wise ones (on
    /// AVX-512 and AVX2, measured); NEON keeps its row-wise kernels.
    pub fn tiles_pay(&self) -> bool {
        matches!(self.isa, Isa::Avx2 | Isa::Avx512)
    }
}

impl fmt::Debug for Kernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kernels({})", self.isa.name())
    }
}

/// The table of `isa`'s kernels, or `None` if this CPU cannot run them.
pub fn table(isa: Isa) -> Option<&'static Kernels> {
    const SETS: usize = Isa::ALL.len();
    static TABLES: [OnceLock<Kernels>; SETS] = [const { OnceLock::new() }; SETS];
    if !isa.is_supported() {
        return None;
    }
    // SAFETY: the CPU supports `isa` (checked above).
    Some(TABLES[isa as usize].get_or_init(|| unsafe { Kernels::new(isa) }))
}

/// How a process wants its kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The set whose kernels run; the CPU must support it.
    pub isa: Isa,
    /// Whether weights are repacked into row tiles where the set's tile
    /// kernels pay ([`crate::quant::tiles::wanted`]). Off keeps the stored
    /// layout, to compare the two with one binary.
    pub tiles: bool,
}

impl Default for Config {
    /// The best set the CPU supports, with row tiles.
    fn default() -> Config {
        Config {
            isa: Isa::detect(),
            tiles: true,
        }
    }
}

/// Why [`configure`] refused a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The CPU cannot run the set.
    Unsupported(Isa),
    /// Kernels were already chosen, differently (by an earlier
    /// [`configure`], or by the default at their first use).
    AlreadyChosen(Config),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Unsupported(isa) => {
                write!(f, "this CPU cannot run the {} kernels", isa.name())
            }
            ConfigError::AlreadyChosen(c) => write!(
                f,
                "kernels were already chosen ({}, tiles {}) before they were configured",
                c.isa.name(),
                if c.tiles { "on" } else { "off" }
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

struct Selection {
    config: Config,
    kernels: &'static Kernels,
}

static SELECTION: OnceLock<Selection> = OnceLock::new();

fn selection() -> &'static Selection {
    SELECTION.get_or_init(|| {
        let config = Config::default();
        let kernels = table(config.isa).expect("the detected set is supported");
        Selection { config, kernels }
    })
}

/// Choose the kernels of this process, once, before anything uses them.
/// Asking again for the configuration already in force is not an error.
pub fn configure(config: Config) -> Result<&'static Kernels, ConfigError> {
    let kernels = table(config.isa).ok_or(ConfigError::Unsupported(config.isa))?;
    let chosen = SELECTION.get_or_init(|| Selection { config, kernels });
    if chosen.config == config {
        Ok(chosen.kernels)
    } else {
        Err(ConfigError::AlreadyChosen(chosen.config))
    }
}

/// The configuration in force ([`Config::default`] if [`configure`] was not
/// called before the first use).
pub fn config() -> Config {
    selection().config
}

/// The kernels this process uses.
pub fn selected() -> &'static Kernels {
    selection().kernels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_exists_exactly_for_the_supported_sets() {
        for isa in Isa::ALL {
            match table(isa) {
                Some(k) => {
                    assert!(isa.is_supported());
                    assert_eq!(k.isa(), isa);
                    // Built once, then the same table.
                    assert!(std::ptr::eq(k, table(isa).unwrap()));
                }
                None => assert!(!isa.is_supported(), "{isa:?}"),
            }
        }
    }

    #[test]
    fn every_computable_type_has_a_dot_in_every_table() {
        for isa in Isa::supported() {
            let k = table(isa).unwrap();
            for ty in GgmlType::ALL {
                let t = traits(ty);
                assert_eq!(k.vec_dot(ty).is_some(), t.is_some(), "{ty} {isa:?}");
                assert_eq!(
                    k.multi_dot(ty).is_some(),
                    t.is_some_and(|t| t.multi.is_some()),
                    "{ty} {isa:?}"
                );
                assert_eq!(
                    k.tile_dot(ty).is_some(),
                    crate::quant::tiles::tile_dot(ty).is_some(),
                    "{ty} {isa:?}"
                );
            }
            assert_eq!(k.tiles_pay(), matches!(isa, Isa::Avx2 | Isa::Avx512));
        }
    }

    #[test]
    fn configure_once_then_only_the_same() {
        // The unit tests never configure, so the default is in force (or
        // becomes it here).
        let c = config();
        assert_eq!(c, Config::default());
        assert!(std::ptr::eq(configure(c).unwrap(), selected()));
        assert_eq!(selected().isa(), c.isa);
        let other = Config {
            tiles: !c.tiles,
            ..c
        };
        assert_eq!(configure(other).unwrap_err(), ConfigError::AlreadyChosen(c));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            configure(Config {
                isa: Isa::Neon,
                tiles: true
            })
            .unwrap_err(),
            ConfigError::Unsupported(Isa::Neon)
        );
    }
}

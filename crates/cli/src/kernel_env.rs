//! The kernel configuration from the environment: read here, at the edge,
//! and handed to the kernels crate once at start-up (the library reads no
//! environment).
//!
//! - `CACHEFIT_KERNELS=scalar|avx2|avx512|neon` forces a kernel set (`auto`
//!   or empty: the best the CPU supports). A name that is unknown, or a set
//!   this CPU cannot run, is reported once on stderr and the detected set
//!   used.
//! - `CACHEFIT_TILES=off` (or `0`) keeps weight matrices in their stored
//!   layout instead of row tiles, to compare the two with one binary.

use kernels::isa::{self, Isa};
use kernels::Config;
use std::sync::OnceLock;

pub const KERNELS_VAR: &str = "CACHEFIT_KERNELS";
pub const TILES_VAR: &str = "CACHEFIT_TILES";

/// What the environment asked of the kernels, and what came of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub config: Config,
    /// The value of [`KERNELS_VAR`], if set.
    pub requested: Option<String>,
    /// Why the requested set was not used, if it was not.
    pub refused: Option<String>,
}

impl Choice {
    /// The choice for these variable values.
    pub fn from_vars(kernels: Option<&str>, tiles: Option<&str>) -> Choice {
        let (isa, refused) = match isa::resolve(kernels) {
            Ok(isa) => (isa, None),
            Err(e) => (Isa::detect(), Some(format!("{KERNELS_VAR}={e}"))),
        };
        let tiles_off = tiles.is_some_and(|v| matches!(v.trim(), "0" | "off"));
        Choice {
            config: Config {
                isa,
                tiles: !tiles_off,
            },
            requested: kernels.map(str::to_string),
            refused,
        }
    }

    /// Whether the set was forced (a set named and used, not detected).
    pub fn forced(&self) -> bool {
        self.refused.is_none()
            && self
                .requested
                .as_deref()
                .is_some_and(|v| !v.trim().is_empty() && !v.trim().eq_ignore_ascii_case("auto"))
    }
}

static CHOICE: OnceLock<Choice> = OnceLock::new();

/// Read the variables and configure the kernels; `main` calls it once,
/// before any command runs.
pub fn configure() {
    let choice = CHOICE.get_or_init(|| {
        let var = |name| std::env::var(name).ok();
        Choice::from_vars(var(KERNELS_VAR).as_deref(), var(TILES_VAR).as_deref())
    });
    if let Some(why) = &choice.refused {
        eprintln!("cachefit: {why}; using {}", choice.config.isa.name());
    }
    if let Err(e) = kernels::configure(choice.config) {
        // Only a use of the kernels before start-up could cause this.
        eprintln!("cachefit: {e}");
    }
}

/// The choice [`configure`] made (the default's if it was not called).
pub fn choice() -> Choice {
    CHOICE
        .get()
        .cloned()
        .unwrap_or_else(|| Choice::from_vars(None, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_map_onto_the_configuration() {
        let c = Choice::from_vars(None, None);
        assert_eq!(
            c.config,
            Config {
                isa: Isa::detect(),
                tiles: true
            }
        );
        assert!(!c.forced() && c.refused.is_none());

        let c = Choice::from_vars(Some("scalar"), Some("off"));
        assert_eq!(
            c.config,
            Config {
                isa: Isa::Scalar,
                tiles: false
            }
        );
        assert!(c.forced());
        assert!(!Choice::from_vars(None, Some("0")).config.tiles);
        assert!(Choice::from_vars(None, Some("on")).config.tiles);
        assert!(!Choice::from_vars(Some("auto"), None).forced());

        let c = Choice::from_vars(Some("sse9"), None);
        assert_eq!(c.config.isa, Isa::detect());
        assert!(!c.forced());
        assert_eq!(
            c.refused.as_deref(),
            Some(
                "CACHEFIT_KERNELS=\"sse9\" is not a kernel set \
                 (expected one of scalar, avx2, avx512, neon)"
            )
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            Choice::from_vars(Some("neon"), None).refused.as_deref(),
            Some("CACHEFIT_KERNELS=neon asks for kernels this CPU cannot run")
        );
    }
}

//! Which CPU this is: its model name and vendor, from `/proc/cpuinfo`, or
//! on x86 from the `cpuid` brand string when that file is missing or says
//! nothing useful.

/// The processor's name and vendor; `None` where neither source knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuInfo {
    /// e.g. "AMD EPYC 9R14 96-Core Processor".
    pub model_name: Option<String>,
    /// e.g. "AuthenticAMD", "GenuineIntel".
    pub vendor: Option<String>,
}

impl CpuInfo {
    /// Read `/proc/cpuinfo`, filling gaps from `cpuid` on x86.
    pub fn probe() -> CpuInfo {
        let mut info = std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| parse_cpuinfo(&s))
            .unwrap_or_default();
        #[cfg(target_arch = "x86_64")]
        {
            if info.model_name.is_none() {
                info.model_name = x86::brand_string();
            }
            if info.vendor.is_none() {
                info.vendor = x86::vendor();
            }
        }
        info
    }
}

/// The model name and vendor of the first processor in a `/proc/cpuinfo`
/// text. Knows the x86 keys (`model name`, `vendor_id`) and the ARM ones
/// (`Hardware` or `Model` for a name, `CPU implementer` for a vendor).
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let field = |keys: &[&str]| {
        keys.iter().find_map(|key| {
            text.lines().find_map(|line| {
                let (k, v) = line.split_once(':')?;
                let v = v.trim();
                (k.trim() == *key && !v.is_empty()).then(|| v.to_string())
            })
        })
    };
    CpuInfo {
        model_name: field(&["model name", "Hardware", "Model"]),
        vendor: field(&["vendor_id", "CPU implementer"]),
    }
}

/// The text of the 48-byte brand string in the registers of `cpuid` leaves
/// 0x8000_0002..=0x8000_0004 (eax, ebx, ecx, edx each), trimmed of padding
/// and NULs; `None` if it is empty.
pub fn brand_from_registers(regs: &[u32; 12]) -> Option<String> {
    let bytes: Vec<u8> = regs.iter().flat_map(|r| r.to_le_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let s = String::from_utf8_lossy(&bytes[..end]);
    // Some CPUs pad with leading spaces and use runs of spaces inside.
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    (!s.is_empty()).then_some(s)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::{__cpuid, __cpuid_count, CpuidResult};

    /// `cpuid` with a sub-leaf. The instruction exists on every x86-64 CPU.
    #[allow(unused_unsafe)]
    pub(crate) fn cpuid(leaf: u32, sub_leaf: u32) -> CpuidResult {
        // SAFETY: cpuid is part of the x86-64 baseline; it has no side
        // effects beyond writing the four registers.
        unsafe { __cpuid_count(leaf, sub_leaf) }
    }

    fn max_extended_leaf() -> u32 {
        #[allow(unused_unsafe)]
        // SAFETY: as in `cpuid`.
        unsafe {
            __cpuid(0x8000_0000).eax
        }
    }

    pub(crate) fn brand_string() -> Option<String> {
        if max_extended_leaf() < 0x8000_0004 {
            return None;
        }
        let mut regs = [0u32; 12];
        for (i, leaf) in (0x8000_0002u32..=0x8000_0004).enumerate() {
            let r = cpuid(leaf, 0);
            regs[i * 4..i * 4 + 4].copy_from_slice(&[r.eax, r.ebx, r.ecx, r.edx]);
        }
        super::brand_from_registers(&regs)
    }

    pub(crate) fn vendor() -> Option<String> {
        let r = cpuid(0, 0);
        // The vendor is the 12 bytes of ebx, edx, ecx in that order.
        let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let s = String::from_utf8_lossy(&bytes).trim().to_string();
        (!s.is_empty()).then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x86_cpuinfo() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC 9R14 96-Core Processor\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: other\n";
        let info = parse_cpuinfo(text);
        assert_eq!(
            info.model_name.as_deref(),
            Some("AMD EPYC 9R14 96-Core Processor")
        );
        assert_eq!(info.vendor.as_deref(), Some("AuthenticAMD"));
    }

    #[test]
    fn arm_cpuinfo_and_missing_fields() {
        let text = "processor\t: 0\nBogoMIPS\t: 243.75\nCPU implementer\t: 0x41\n\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n";
        let info = parse_cpuinfo(text);
        assert_eq!(
            info.model_name.as_deref(),
            Some("Raspberry Pi 5 Model B Rev 1.0")
        );
        assert_eq!(info.vendor.as_deref(), Some("0x41"));
        assert_eq!(parse_cpuinfo(""), CpuInfo::default());
        assert_eq!(parse_cpuinfo("model name\t:\n"), CpuInfo::default());
    }

    #[test]
    fn brand_string_from_registers() {
        let text = b"  Intel(R) Xeon(R)  CPU @ 2.20GHz\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
        let mut regs = [0u32; 12];
        for (i, r) in regs.iter_mut().enumerate() {
            *r = u32::from_le_bytes(text[i * 4..i * 4 + 4].try_into().unwrap());
        }
        assert_eq!(
            brand_from_registers(&regs).as_deref(),
            Some("Intel(R) Xeon(R) CPU @ 2.20GHz")
        );
        assert_eq!(brand_from_registers(&[0; 12]), None);
    }

    #[test]
    fn probe_does_not_panic() {
        let _ = CpuInfo::probe();
    }
}

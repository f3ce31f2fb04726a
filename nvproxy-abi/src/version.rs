//! Driver version numbers as NVIDIA writes them: `535.216.03`, `580.142`.

use core::fmt;
use core::str::FromStr;

use crate::AbiError;

/// An NVIDIA driver version: `major.minor` or `major.minor.patch`, where the patch is always
/// written with two digits (`535.216.03`). Parsing and display round-trip exactly; the parser
/// rejects forms NVIDIA does not use (leading zeros in major/minor, one- or three-digit patches),
/// so two spellings of one version cannot both exist.
///
/// Ordering is numeric, component by component (`565.77` < `565.77.01` < `570.86.15`). Note that
/// this is *not* release order: branches are maintained in parallel (570.211.01 was released after
/// 575.64.05).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DriverVersion {
    major: u16,
    minor: u16,
    patch: Option<u8>,
}

impl DriverVersion {
    /// A version from its parts; `patch` must be below 100 (it is printed with two digits).
    pub const fn new(major: u16, minor: u16, patch: Option<u8>) -> DriverVersion {
        if let Some(p) = patch {
            assert!(p < 100, "patch is printed with two digits");
        }
        DriverVersion {
            major,
            minor,
            patch,
        }
    }

    /// The branch number, e.g. 535.
    pub const fn major(&self) -> u16 {
        self.major
    }

    /// The second component, e.g. 216 in `535.216.03`.
    pub const fn minor(&self) -> u16 {
        self.minor
    }

    /// The two-digit third component, if any.
    pub const fn patch(&self) -> Option<u8> {
        self.patch
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.patch {
            Some(p) => write!(f, "{}.{}.{:02}", self.major, self.minor, p),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

impl fmt::Debug for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DriverVersion({self})")
    }
}

fn parse_component(text: &str, what: &'static str, input: &str) -> Result<u16, AbiError> {
    let bad = |why: &'static str| AbiError::BadVersion {
        input: input.to_owned(),
        why,
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(match what {
            "major" => "the major component must be a decimal number",
            _ => "the minor component must be a decimal number",
        }));
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(bad(
            "leading zeros are only allowed in the two-digit patch component",
        ));
    }
    text.parse().map_err(|_| bad("component too large"))
}

impl FromStr for DriverVersion {
    type Err = AbiError;

    /// Parses `MAJOR.MINOR` or `MAJOR.MINOR.PP` (PP: exactly two digits).
    fn from_str(s: &str) -> Result<DriverVersion, AbiError> {
        let bad = |why: &'static str| AbiError::BadVersion {
            input: s.to_owned(),
            why,
        };
        let mut parts = s.split('.');
        let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
            return Err(bad(
                "expected MAJOR.MINOR or MAJOR.MINOR.PP, e.g. 580.142 or 535.216.03",
            ));
        };
        let patch = parts.next();
        if parts.next().is_some() {
            return Err(bad(
                "too many components; expected at most three (535.216.03)",
            ));
        }
        let major = parse_component(major, "major", s)?;
        let minor = parse_component(minor, "minor", s)?;
        let patch = match patch {
            None => None,
            Some(p) if p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()) => {
                Some(p.parse().map_err(|_| bad("bad patch component"))?)
            }
            Some(_) => return Err(bad("the patch component must be exactly two digits (03)")),
        };
        Ok(DriverVersion {
            major,
            minor,
            patch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_display_roundtrip_zero_padded_patch() {
        let v: DriverVersion = "535.216.03".parse().unwrap();
        assert_eq!(v.to_string(), "535.216.03");
    }

    #[test]
    fn test_parse_display_roundtrip_two_components() {
        let v: DriverVersion = "580.142".parse().unwrap();
        assert_eq!(
            (v.major(), v.minor(), v.patch(), v.to_string()),
            (580, 142, None, "580.142".into())
        );
    }

    #[test]
    fn test_parse_rejects_one_digit_patch_with_clear_message() {
        let err = "535.216.3".parse::<DriverVersion>().unwrap_err();
        assert!(err.to_string().contains("exactly two digits"), "{err}");
    }

    #[test]
    fn test_parse_rejects_garbage() {
        for bad in [
            "",
            "535",
            "x.1",
            "535.216.03.1",
            "535..03",
            "0535.216.03",
            "535.216.-1",
        ] {
            assert!(bad.parse::<DriverVersion>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn test_order_is_numeric() {
        let a: DriverVersion = "565.77".parse().unwrap();
        let b: DriverVersion = "570.86.15".parse().unwrap();
        let c: DriverVersion = "570.211.01".parse().unwrap();
        assert!(a < b && b < c);
    }
}

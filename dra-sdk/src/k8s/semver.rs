//! The one semantic-version parser (semver.org 2.0.0) of the workspace: `version` attributes
//! ([`Version`](crate::attributes::Version)), the slice validator and the allocator's CEL
//! `semver()` all use it, so they cannot disagree on what a version is.

use std::cmp::Ordering;
use std::fmt;

use super::ParseError;

/// A parsed semantic version. Build metadata is kept for display but, as the specification
/// requires, ignored in comparisons and equality.
///
/// ```
/// use dra_sdk::k8s::Semver;
///
/// let release = Semver::parse("1.2.3")?;
/// assert!(Semver::parse("1.2.3-rc.1")? < release);
/// assert_eq!(Semver::parse_normalized("v1.2")?.to_string(), "1.2.0");
/// # Ok::<(), dra_sdk::k8s::ParseError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Semver {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<Identifier>,
    build: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Identifier {
    /// Digits without leading zeros, kept as text: semver puts no bound on their size.
    Numeric(String),
    Alphanumeric(String),
}

impl Ord for Identifier {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            // Without leading zeros, the longer number is the larger one.
            (Identifier::Numeric(a), Identifier::Numeric(b)) => {
                a.len().cmp(&b.len()).then_with(|| a.cmp(b))
            }
            // Numeric identifiers have lower precedence than alphanumeric ones.
            (Identifier::Numeric(_), Identifier::Alphanumeric(_)) => Ordering::Less,
            (Identifier::Alphanumeric(_), Identifier::Numeric(_)) => Ordering::Greater,
            (Identifier::Alphanumeric(a), Identifier::Alphanumeric(b)) => a.cmp(b),
        }
    }
}

impl PartialOrd for Identifier {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One of MAJOR, MINOR and PATCH; `strict` rejects leading zeros.
fn parse_number(part: &str, strict: bool) -> Result<u64, &'static str> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return Err("MAJOR, MINOR and PATCH must be non-negative integers");
    }
    if strict && part.len() > 1 && part.starts_with('0') {
        return Err("MAJOR, MINOR and PATCH must not have leading zeros");
    }
    part.parse()
        .map_err(|_| "MAJOR, MINOR and PATCH must fit in 64 bits")
}

/// A pre-release or build identifier: non-empty `[0-9A-Za-z-]+`.
fn check_identifier(identifier: &str) -> Result<(), &'static str> {
    if identifier.is_empty() {
        return Err("pre-release and build identifiers must not be empty");
    }
    if !identifier
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err("pre-release and build identifiers may only contain [0-9A-Za-z-]");
    }
    Ok(())
}

impl Semver {
    /// Parses a version exactly as semver 2.0.0 writes it: `MAJOR.MINOR.PATCH[-PRE][+BUILD]`.
    pub fn parse(input: &str) -> Result<Self, ParseError> {
        Self::parse_with(input, false)
    }

    /// Like [`Semver::parse`], but first normalizes the input the way Kubernetes'
    /// `semver(s, true)` does: an optional `v` prefix, missing minor or patch numbers (taken as
    /// 0) and leading zeros are accepted.
    pub fn parse_normalized(input: &str) -> Result<Self, ParseError> {
        Self::parse_with(input, true)
    }

    fn parse_with(input: &str, normalize: bool) -> Result<Self, ParseError> {
        Self::parse_reason(input, normalize)
            .map_err(|reason| ParseError::new("semantic version", input, reason))
    }

    fn parse_reason(input: &str, normalize: bool) -> Result<Self, &'static str> {
        let mut rest = input;
        if normalize {
            rest = rest.strip_prefix('v').unwrap_or(rest);
        }
        let (rest, build) = match rest.split_once('+') {
            Some((rest, build)) => (rest, Some(build)),
            None => (rest, None),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };
        let mut numbers = core.split('.');
        let mut next = |required: bool| -> Result<u64, &'static str> {
            match numbers.next() {
                Some(part) => parse_number(part, !normalize),
                None if !required => Ok(0),
                None => Err("expected MAJOR.MINOR.PATCH"),
            }
        };
        let major = next(true)?;
        let minor = next(!normalize)?;
        let patch = next(!normalize)?;
        if numbers.next().is_some() {
            return Err("expected MAJOR.MINOR.PATCH");
        }
        let pre = match pre {
            None => Vec::new(),
            Some(pre) => pre
                .split('.')
                .map(|id| {
                    check_identifier(id)?;
                    if !id.bytes().all(|b| b.is_ascii_digit()) {
                        Ok(Identifier::Alphanumeric(id.to_owned()))
                    } else if id.len() > 1 && id.starts_with('0') {
                        Err("numeric pre-release identifiers must not have leading zeros")
                    } else {
                        Ok(Identifier::Numeric(id.to_owned()))
                    }
                })
                .collect::<Result<_, _>>()?,
        };
        if let Some(build) = build {
            build.split('.').try_for_each(check_identifier)?;
        }
        Ok(Self {
            major,
            minor,
            patch,
            pre,
            build: build.map(str::to_owned),
        })
    }

    /// The MAJOR number.
    pub fn major(&self) -> u64 {
        self.major
    }

    /// The MINOR number.
    pub fn minor(&self) -> u64 {
        self.minor
    }

    /// The PATCH number.
    pub fn patch(&self) -> u64 {
        self.patch
    }
}

impl PartialEq for Semver {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Semver {}

impl Ord for Semver {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                // A pre-release sorts before the release it precedes.
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => self.pre.cmp(&other.pre),
            })
    }
}

impl PartialOrd for Semver {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        for (i, id) in self.pre.iter().enumerate() {
            f.write_str(if i == 0 { "-" } else { "." })?;
            match id {
                Identifier::Numeric(n) => f.write_str(n)?,
                Identifier::Alphanumeric(s) => f.write_str(s)?,
            }
        }
        if let Some(build) = &self.build {
            write!(f, "+{build}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Semver {
        Semver::parse(s).unwrap()
    }

    #[test]
    fn orders_by_precedence() {
        let ordered = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.2.0",
            "1.10.0",
            "2.0.0",
        ];
        for pair in ordered.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(v("1.2.3+build.5"), v("1.2.3"));
        assert_eq!(v("1.2.3-rc.1+meta").to_string(), "1.2.3-rc.1+meta");
    }

    #[test]
    fn strict_and_normalized_parsing() {
        for bad in [
            "1.2", "v1.2.3", "01.2.3", "1.2.3-01", "1.2.3.4", "1.2.3-", "1.2.3+", "a.b.c", "",
        ] {
            assert!(Semver::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(Semver::parse_normalized("v1.2").unwrap(), v("1.2.0"));
        assert_eq!(Semver::parse_normalized("01.02.03").unwrap(), v("1.2.3"));
        let parsed = v("10.20.30");
        assert_eq!(
            (parsed.major(), parsed.minor(), parsed.patch()),
            (10, 20, 30)
        );
    }
}

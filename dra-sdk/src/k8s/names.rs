//! Name rules of Kubernetes and `resource.k8s.io`: the crate's one copy, used by slice
//! validation, the CDI writer, the socket paths and (through [`NameRule`]) the test kit.

/// Maximum length of a DNS label.
pub(crate) const DNS_LABEL_MAX: usize = 63;
/// Maximum length of a DNS subdomain.
pub(crate) const DNS_SUBDOMAIN_MAX: usize = 253;
/// Maximum length of a driver name.
pub(crate) const DRIVER_NAME_MAX: usize = 63;
/// Maximum length of a pool name.
pub(crate) const POOL_NAME_MAX: usize = 253;
/// Maximum length of the identifier part of a qualified attribute or capacity name.
pub(crate) const C_IDENTIFIER_MAX: usize = 32;
/// Maximum length of the domain part of a qualified attribute or capacity name.
pub(crate) const QUALIFIED_DOMAIN_MAX: usize = 63;

type Rule = Result<(), &'static str>;

/// A Kubernetes name rule, for code outside the SDK that checks names the way the SDK and the
/// API server do (test doubles, admission checks, drivers validating their configuration).
///
/// ```
/// use dra_sdk::k8s::NameRule;
///
/// assert!(NameRule::DriverName.check("gpu.example.com").is_ok());
/// assert_eq!(
///     NameRule::DnsLabel.check("GPU-0"),
///     Err("may contain only lower-case letters, digits and '-'")
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NameRule {
    /// An RFC 1123 label: at most 63 lower-case letters, digits and `-` (device names).
    DnsLabel,
    /// An RFC 1123 subdomain: labels joined by `.`, at most 253 characters (object names).
    DnsSubdomain,
    /// A DRA driver name: a DNS subdomain of at most 63 characters.
    DriverName,
    /// A pool name: DNS subdomains joined by `/`, at most 253 characters.
    PoolName,
    /// A C identifier of at most 32 characters (the name part of attributes and capacities).
    CIdentifier,
    /// An attribute or capacity name: `<C identifier>` or `<domain>/<C identifier>`.
    QualifiedName,
    /// A label key: `[<prefix>/]<name>`.
    LabelKey,
    /// A label value: empty, or at most 63 alphanumerics, `-`, `_` and `.` between
    /// alphanumerics.
    LabelValue,
    /// The `apiVersion` of a driver's own API: `<DNS subdomain>/<version>`, the version a DNS
    /// label starting with a letter (`gpu.example.com/v1beta1`).
    ApiVersion,
    /// An object kind: UpperCamelCase ASCII letters and digits, at most 63 (`GpuConfig`).
    Kind,
}

impl NameRule {
    /// Checks `name` against the rule. The error says what is wrong, worded to follow the
    /// name in a message (`"GPU-0" may contain only ...`).
    ///
    /// A `const fn`, so names known at compile time can be checked there (the derive macros do).
    pub const fn check(self, name: &str) -> Result<(), &'static str> {
        match self {
            NameRule::DnsLabel => dns_label(name),
            NameRule::DnsSubdomain => dns_subdomain(name),
            NameRule::DriverName => driver_name(name),
            NameRule::PoolName => pool_name(name),
            NameRule::CIdentifier => c_identifier(name),
            NameRule::QualifiedName => qualified_name(name),
            NameRule::LabelKey => label_key(name),
            NameRule::LabelValue => label_value(name),
            NameRule::ApiVersion => api_version(name),
            NameRule::Kind => kind(name),
        }
    }

    /// The longest name the rule accepts, in bytes (for messages such as "too long by 3").
    pub fn max_len(self) -> usize {
        match self {
            NameRule::DnsLabel | NameRule::LabelValue => DNS_LABEL_MAX,
            NameRule::DnsSubdomain => DNS_SUBDOMAIN_MAX,
            NameRule::PoolName => POOL_NAME_MAX,
            NameRule::DriverName => DRIVER_NAME_MAX,
            NameRule::CIdentifier => C_IDENTIFIER_MAX,
            NameRule::QualifiedName => QUALIFIED_DOMAIN_MAX + 1 + C_IDENTIFIER_MAX,
            NameRule::LabelKey | NameRule::ApiVersion => DNS_SUBDOMAIN_MAX + 1 + DNS_LABEL_MAX,
            NameRule::Kind => DNS_LABEL_MAX,
        }
    }
}

/// What is wrong with one RFC 1123 label, in the order it is checked. Every DNS-label and
/// DNS-subdomain check of the crate (slices, CDI annotation keys, driver names for sockets, the
/// fake API server's object names) goes through [`label_defect`]; callers word the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LabelDefect {
    /// The label is empty (e.g. `a..b`).
    Empty,
    /// A character other than a lower-case letter, a digit or `-`.
    Character,
    /// Starts or ends with `-`.
    Edge,
}

// The rules are `const fn` so that the derive macros check names at compile time with this one
// copy: they expand to a `const` item that calls [`NameRule::check`] and panics with its
// reason. `const fn` rules out iterators, `?` and `str` slicing, hence the byte loops.

/// `bytes[start..end]`, in a `const fn`.
const fn range(bytes: &[u8], start: usize, end: usize) -> &[u8] {
    bytes.split_at(end).0.split_at(start).1
}

/// The first index of `byte` in `bytes`.
const fn find(bytes: &[u8], byte: u8) -> Option<usize> {
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == byte {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// The characters a rule allows (function pointers cannot be called in a `const fn`).
#[derive(Clone, Copy)]
enum Allowed {
    /// Lower-case letters, digits and `-`.
    Label,
    /// Letters of either case, digits and `-` (driver names).
    LabelAnyCase,
    /// Letters, digits and `_`.
    Identifier,
    /// Letters, digits, `-`, `_` and `.`.
    LabelValue,
    /// Letters and digits.
    Alphanumeric,
}

impl Allowed {
    const fn accepts(self, b: u8) -> bool {
        match self {
            Allowed::Label => b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-',
            Allowed::LabelAnyCase => b.is_ascii_alphanumeric() || b == b'-',
            Allowed::Identifier => b.is_ascii_alphanumeric() || b == b'_',
            Allowed::LabelValue => b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'),
            Allowed::Alphanumeric => b.is_ascii_alphanumeric(),
        }
    }

    const fn all(self, bytes: &[u8]) -> bool {
        let mut at = 0;
        while at < bytes.len() {
            if !self.accepts(bytes[at]) {
                return false;
            }
            at += 1;
        }
        true
    }
}

/// The first defect of `label` as one RFC 1123 label, ignoring length (callers apply theirs).
pub(crate) const fn label_defect(label: &str) -> Option<LabelDefect> {
    label_bytes_defect(label.as_bytes(), Allowed::Label)
}

const fn label_bytes_defect(label: &[u8], accept: Allowed) -> Option<LabelDefect> {
    if label.is_empty() {
        Some(LabelDefect::Empty)
    } else if !accept.all(label) {
        Some(LabelDefect::Character)
    } else if label[0] == b'-' || label[label.len() - 1] == b'-' {
        Some(LabelDefect::Edge)
    } else {
        None
    }
}

/// One RFC 1123 label without a length limit (the callers apply theirs).
const fn label_chars(label: &[u8], accept: Allowed) -> Rule {
    match label_bytes_defect(label, accept) {
        None => Ok(()),
        Some(LabelDefect::Empty) => Err("must not be empty"),
        Some(LabelDefect::Character) => Err("may contain only lower-case letters, digits and '-'"),
        Some(LabelDefect::Edge) => Err("must start and end with a lower-case letter or digit"),
    }
}

/// A DNS label (RFC 1123): at most 63 lower-case letters, digits and `-`.
pub(crate) const fn dns_label(s: &str) -> Rule {
    if s.len() > DNS_LABEL_MAX {
        return Err("must be at most 63 characters");
    }
    label_chars(s.as_bytes(), Allowed::Label)
}

/// Labels joined by `.`, at most `max` bytes in total.
const fn subdomain_bytes(s: &[u8], max: usize, accept: Allowed) -> Rule {
    if s.len() > max {
        return Err(match max {
            DNS_SUBDOMAIN_MAX => "must be at most 253 characters",
            DNS_LABEL_MAX => "must be at most 63 characters",
            _ => "is too long",
        });
    }
    let mut start = 0;
    let mut at = 0;
    while at <= s.len() {
        if at == s.len() || s[at] == b'.' {
            if let Err(reason) = label_chars(range(s, start, at), accept) {
                return Err(reason);
            }
            start = at + 1;
        }
        at += 1;
    }
    Ok(())
}

/// A DNS subdomain (RFC 1123): labels joined by `.`, at most `max` characters in total.
pub(crate) const fn dns_subdomain_max(s: &str, max: usize) -> Rule {
    subdomain_bytes(s.as_bytes(), max, Allowed::Label)
}

/// A DNS subdomain of at most 253 characters.
pub(crate) const fn dns_subdomain(s: &str) -> Rule {
    dns_subdomain_max(s, DNS_SUBDOMAIN_MAX)
}

/// A driver name: a DNS subdomain of at most 63 characters, upper case allowed.
///
/// The API server accepts upper case in `spec.driver` (kube-apiserver v1.36.2 answers
/// `GPU.Example.com` with a warning, not an error), so the SDK does too; slice names are written
/// in lower case (the publisher's slice names).
pub(crate) const fn driver_name(s: &str) -> Rule {
    subdomain_bytes(s.as_bytes(), DRIVER_NAME_MAX, Allowed::LabelAnyCase)
}

/// A pool name: DNS subdomains joined by `/`, at most 253 characters.
pub(crate) const fn pool_name(s: &str) -> Rule {
    let bytes = s.as_bytes();
    if bytes.len() > POOL_NAME_MAX {
        return Err("must be at most 253 characters");
    }
    let mut start = 0;
    let mut at = 0;
    while at <= bytes.len() {
        if at == bytes.len() || bytes[at] == b'/' {
            let part = range(bytes, start, at);
            if let Err(reason) = subdomain_bytes(part, DNS_SUBDOMAIN_MAX, Allowed::Label) {
                return Err(reason);
            }
            start = at + 1;
        }
        at += 1;
    }
    Ok(())
}

/// A C identifier of at most 32 characters.
pub(crate) const fn c_identifier(s: &str) -> Rule {
    identifier_bytes(s.as_bytes())
}

const fn identifier_bytes(bytes: &[u8]) -> Rule {
    if bytes.is_empty() {
        return Err("identifier must not be empty");
    }
    if bytes.len() > C_IDENTIFIER_MAX {
        return Err("identifier must be at most 32 characters");
    }
    if bytes[0].is_ascii_digit() {
        return Err("identifier must not start with a digit");
    }
    if !Allowed::Identifier.all(bytes) {
        return Err("identifier may contain only letters, digits and '_'");
    }
    Ok(())
}

/// An attribute or capacity name: a C identifier, optionally prefixed by `<domain>/`.
pub(crate) const fn qualified_name(s: &str) -> Rule {
    let bytes = s.as_bytes();
    let Some(slash) = find(bytes, b'/') else {
        return identifier_bytes(bytes);
    };
    let (domain, identifier) = (range(bytes, 0, slash), range(bytes, slash + 1, bytes.len()));
    if domain.len() > QUALIFIED_DOMAIN_MAX {
        return Err("domain must be at most 63 characters");
    }
    if let Err(reason) = subdomain_bytes(domain, DNS_SUBDOMAIN_MAX, Allowed::Label) {
        return Err(reason);
    }
    identifier_bytes(identifier)
}

/// The name part of a label key (also of CDI annotation keys), or a non-empty label value.
pub(crate) const fn label_name_part(s: &str) -> Rule {
    name_part_bytes(s.as_bytes())
}

const fn name_part_bytes(bytes: &[u8]) -> Rule {
    if bytes.len() > 63 {
        return Err("must be at most 63 characters");
    }
    if bytes.is_empty()
        || !bytes[0].is_ascii_alphanumeric()
        || !bytes[bytes.len() - 1].is_ascii_alphanumeric()
    {
        return Err("must start and end with a letter or digit");
    }
    if !Allowed::LabelValue.all(bytes) {
        return Err("may contain only letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// A label key (taint keys, condition types): `[<DNS subdomain>/]<name>`.
pub(crate) const fn label_key(s: &str) -> Rule {
    let bytes = s.as_bytes();
    let Some(slash) = find(bytes, b'/') else {
        return name_part_bytes(bytes);
    };
    let prefix = range(bytes, 0, slash);
    if let Err(reason) = subdomain_bytes(prefix, DNS_SUBDOMAIN_MAX, Allowed::Label) {
        return Err(reason);
    }
    name_part_bytes(range(bytes, slash + 1, bytes.len()))
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_`, `.` with alphanumeric ends.
pub(crate) const fn label_value(s: &str) -> Rule {
    if s.is_empty() {
        return Ok(());
    }
    label_name_part(s)
}

/// The `apiVersion` of a driver's own API (opaque configs): `<group>/<version>`, the group a DNS
/// subdomain, the version a DNS label starting with a letter (`v1`, `v1beta1`).
pub(crate) const fn api_version(s: &str) -> Rule {
    let bytes = s.as_bytes();
    let Some(slash) = find(bytes, b'/') else {
        return Err("must be <group>/<version>, like gpu.example.com/v1");
    };
    let (group, version) = (range(bytes, 0, slash), range(bytes, slash + 1, bytes.len()));
    if subdomain_bytes(group, DNS_SUBDOMAIN_MAX, Allowed::Label).is_err() {
        return Err("must have a lower-case DNS subdomain as its group, like gpu.example.com");
    }
    if version.is_empty()
        || !version[0].is_ascii_lowercase()
        || subdomain_bytes(version, DNS_LABEL_MAX, Allowed::Label).is_err()
        || find(version, b'.').is_some()
    {
        return Err(
            "must have a lower-case DNS label starting with a letter as its version, like v1",
        );
    }
    Ok(())
}

/// A kind: an UpperCamelCase identifier of at most 63 ASCII letters and digits (`GpuConfig`).
pub(crate) const fn kind(s: &str) -> Rule {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() > DNS_LABEL_MAX {
        return Err("must be 1 to 63 characters");
    }
    if !bytes[0].is_ascii_uppercase() || !Allowed::Alphanumeric.all(bytes) {
        return Err("must be UpperCamelCase ASCII letters and digits, like GpuConfig");
    }
    Ok(())
}

/// A semantic version per semver.org 2.0.0 (the crate's one parser, [`Semver`](super::Semver)).
pub(crate) fn semver(s: &str) -> Rule {
    super::Semver::parse(s)
        .map(drop)
        .map_err(|_| "must be a semantic version (semver 2.0.0), e.g. 1.2.3-rc.1+build.5")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_rules() {
        assert!(dns_label("gpu-0").is_ok());
        assert!(dns_label("Gpu").is_err());
        assert!(dns_label("-gpu").is_err());
        assert!(dns_label("gpu.0").is_err());
        assert!(dns_label(&"a".repeat(64)).is_err());
        assert!(dns_subdomain("gpu.example.com").is_ok());
        assert!(dns_subdomain("gpu..example.com").is_err());
        assert!(dns_subdomain("gpu.-example.com").is_err());
        assert!(driver_name(&format!("{}.com", "a".repeat(60))).is_err());
        // Recorded: the real server accepts both (upper case with a warning).
        assert!(driver_name("GPU.Example.com").is_ok());
        assert!(driver_name("gpu").is_ok());
        assert!(driver_name("gpu_0.example.com").is_err());
        assert!(pool_name("cluster/rack-1/node.a").is_ok());
        assert!(pool_name("cluster//x").is_err());
    }

    #[test]
    fn attribute_names_of_the_derive_macros() {
        for good in [
            "index",
            "_x",
            "a1",
            "gpu.nvidia.com/cudaDriverVersion",
            "example/x",
            "a-b.c/x",
            &"a".repeat(32),
            &format!("{}/x", "d".repeat(63)),
        ] {
            assert_eq!(qualified_name(good), Ok(()), "{good}");
        }
        for (bad, reason) in [
            ("", "identifier must not be empty"),
            (
                "pcie-root",
                "identifier may contain only letters, digits and '_'",
            ),
            ("1st", "identifier must not start with a digit"),
            (
                "a.b/c/d",
                "identifier may contain only letters, digits and '_'",
            ),
            ("example.com/", "identifier must not be empty"),
            (
                "Example.com/x",
                "may contain only lower-case letters, digits and '-'",
            ),
            (
                "-a.com/x",
                "must start and end with a lower-case letter or digit",
            ),
            ("a..com/x", "must not be empty"),
            ("/x", "must not be empty"),
            (&"a".repeat(33), "identifier must be at most 32 characters"),
            (
                &format!("{}/x", "d".repeat(64)),
                "domain must be at most 63 characters",
            ),
        ] {
            assert_eq!(qualified_name(bad), Err(reason), "{bad}");
        }
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name("model").is_ok());
        assert!(qualified_name("resource.kubernetes.io/pcieRoot").is_ok());
        assert!(qualified_name("1model").is_err());
        assert!(qualified_name("model-name").is_err());
        assert!(qualified_name(&"a".repeat(33)).is_err());
        assert!(qualified_name("Example.com/model").is_err());
        assert!(qualified_name("example.com/").is_err());
    }

    #[test]
    fn api_versions_and_kinds() {
        for good in [
            "gpu.example.com/v1",
            "resource.nvidia.com/v1beta1",
            "x/v2alpha3",
        ] {
            assert_eq!(api_version(good), Ok(()), "{good}");
        }
        for bad in [
            "v1",
            "Gpu.example.com/v1",
            "gpu.example.com/1",
            "gpu.example.com/V1",
            "/v1",
            "gpu.example.com/",
            "a/v1.2",
            "a/v1/x",
            "a_b/v1",
        ] {
            assert!(api_version(bad).is_err(), "{bad}");
        }
        for good in ["GpuConfig", "X", "MigDeviceConfig2"] {
            assert_eq!(kind(good), Ok(()), "{good}");
        }
        for bad in ["", "gpuConfig", "Gpu_Config", "Gpu-Config", "1Gpu"] {
            assert!(kind(bad).is_err(), "{bad}");
        }
        assert!(kind(&format!("G{}", "a".repeat(63))).is_err());
    }

    /// The rules run at compile time (what the derive macros rely on).
    #[test]
    fn rules_are_const() {
        const OK: Result<(), &str> = NameRule::QualifiedName.check("example.com/model");
        const BAD: Result<(), &str> = NameRule::DnsLabel.check("GPU");
        assert_eq!(OK, Ok(()));
        assert!(BAD.is_err());
    }

    #[test]
    fn label_rules() {
        assert!(label_key("example.com/unhealthy").is_ok());
        assert!(label_key("Unhealthy_1.x").is_ok());
        assert!(label_key("example.com/-x").is_err());
        assert!(label_value("").is_ok());
        assert!(label_value("xid-79").is_ok());
        assert!(label_value("bad value").is_err());
    }

    #[test]
    fn semver_rules() {
        for ok in [
            "1.2.3",
            "0.0.0",
            "1.2.3-rc.1",
            "1.2.3+build.5",
            "1.2.3-0a.1+x-y",
        ] {
            assert!(semver(ok).is_ok(), "{ok}");
        }
        for bad in [
            "1.2",
            "01.2.3",
            "1.2.3-01",
            "1.2.3-",
            "1.2.3+",
            "v1.2.3",
            "1.2.3-a..b",
        ] {
            assert!(semver(bad).is_err(), "{bad}");
        }
    }
}

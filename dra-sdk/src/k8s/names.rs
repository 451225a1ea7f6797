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
}

impl NameRule {
    /// Checks `name` against the rule. The error says what is wrong, worded to follow the
    /// name in a message (`"GPU-0" may contain only ...`).
    pub fn check(self, name: &str) -> Result<(), &'static str> {
        match self {
            NameRule::DnsLabel => dns_label(name),
            NameRule::DnsSubdomain => dns_subdomain(name),
            NameRule::DriverName => driver_name(name),
            NameRule::PoolName => pool_name(name),
            NameRule::CIdentifier => c_identifier(name),
            NameRule::QualifiedName => qualified_name(name),
            NameRule::LabelKey => label_key(name),
            NameRule::LabelValue => label_value(name),
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
            NameRule::LabelKey => DNS_SUBDOMAIN_MAX + 1 + DNS_LABEL_MAX,
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

/// The first defect of `label` as one RFC 1123 label, ignoring length (callers apply theirs).
pub(crate) fn label_defect(label: &str) -> Option<LabelDefect> {
    if label.is_empty() {
        Some(LabelDefect::Empty)
    } else if !label
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Some(LabelDefect::Character)
    } else if label.starts_with('-') || label.ends_with('-') {
        Some(LabelDefect::Edge)
    } else {
        None
    }
}

/// One RFC 1123 label without a length limit (the callers apply theirs).
fn label_chars(s: &str) -> Rule {
    match label_defect(s) {
        None => Ok(()),
        Some(LabelDefect::Empty) => Err("must not be empty"),
        Some(LabelDefect::Character) => Err("may contain only lower-case letters, digits and '-'"),
        Some(LabelDefect::Edge) => Err("must start and end with a lower-case letter or digit"),
    }
}

/// A DNS label (RFC 1123): at most 63 lower-case letters, digits and `-`.
pub(crate) fn dns_label(s: &str) -> Rule {
    if s.len() > DNS_LABEL_MAX {
        return Err("must be at most 63 characters");
    }
    label_chars(s)
}

/// A DNS subdomain (RFC 1123): labels joined by `.`, at most `max` characters in total.
pub(crate) fn dns_subdomain_max(s: &str, max: usize) -> Rule {
    if s.len() > max {
        return Err(if max == DNS_SUBDOMAIN_MAX {
            "must be at most 253 characters"
        } else {
            "is too long"
        });
    }
    s.split('.').try_for_each(label_chars)
}

/// A DNS subdomain of at most 253 characters.
pub(crate) fn dns_subdomain(s: &str) -> Rule {
    dns_subdomain_max(s, DNS_SUBDOMAIN_MAX)
}

/// A driver name: a DNS subdomain of at most 63 characters, upper case allowed.
///
/// The API server accepts upper case in `spec.driver` (kube-apiserver v1.36.2 answers
/// `GPU.Example.com` with a warning, not an error), so the SDK does too; slice names are written
/// in lower case (the publisher's slice names).
pub(crate) fn driver_name(s: &str) -> Rule {
    if s.len() > DRIVER_NAME_MAX {
        return Err("must be at most 63 characters");
    }
    dns_subdomain(&s.to_ascii_lowercase())
}

/// A pool name: DNS subdomains joined by `/`, at most 253 characters.
pub(crate) fn pool_name(s: &str) -> Rule {
    if s.len() > POOL_NAME_MAX {
        return Err("must be at most 253 characters");
    }
    s.split('/').try_for_each(dns_subdomain)
}

/// A C identifier of at most 32 characters.
pub(crate) fn c_identifier(s: &str) -> Rule {
    let bytes = s.as_bytes();
    if bytes.is_empty() {
        return Err("must not be empty");
    }
    if s.len() > C_IDENTIFIER_MAX {
        return Err("identifier must be at most 32 characters");
    }
    if bytes[0].is_ascii_digit() {
        return Err("identifier must not start with a digit");
    }
    if !bytes
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err("identifier may contain only letters, digits and '_'");
    }
    Ok(())
}

/// An attribute or capacity name: a C identifier, optionally prefixed by `<domain>/`.
pub(crate) fn qualified_name(s: &str) -> Rule {
    match s.split_once('/') {
        None => c_identifier(s),
        Some((domain, identifier)) => {
            if domain.len() > QUALIFIED_DOMAIN_MAX {
                return Err("domain must be at most 63 characters");
            }
            dns_subdomain(domain)?;
            c_identifier(identifier)
        }
    }
}

/// The name part of a label key (also of CDI annotation keys), or a non-empty label value.
pub(crate) fn label_name_part(s: &str) -> Rule {
    let bytes = s.as_bytes();
    if s.len() > 63 {
        return Err("must be at most 63 characters");
    }
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    if !edge_ok(bytes.first()) || !edge_ok(bytes.last()) {
        return Err("must start and end with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("may contain only letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// A label key (taint keys, condition types): `[<DNS subdomain>/]<name>`.
pub(crate) fn label_key(s: &str) -> Rule {
    match s.split_once('/') {
        None => label_name_part(s),
        Some((prefix, name)) => {
            dns_subdomain(prefix)?;
            label_name_part(name)
        }
    }
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_`, `.` with alphanumeric ends.
pub(crate) fn label_value(s: &str) -> Rule {
    if s.is_empty() {
        return Ok(());
    }
    label_name_part(s)
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

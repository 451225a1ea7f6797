//! Kubernetes name rules checked at compile time (kubelet-wire §3.3).

/// Attributes plus capacities of one device.
pub(crate) const MAX_DEVICE_ENTRIES: usize = 32;
/// The identifier part of an attribute or capacity name.
const MAX_IDENTIFIER: usize = 32;
/// The domain part of a qualified attribute or capacity name.
const MAX_ATTRIBUTE_DOMAIN: usize = 63;
/// An API group (a DNS subdomain).
const MAX_API_GROUP: usize = 253;
/// A version or a kind (a DNS label).
const MAX_LABEL: usize = 63;

/// `driver_version` → `driverVersion`; `r#type` → `type`. Only underscores are treated as
/// word breaks, so names already in camel case (`pciBusID`) are kept; leading underscores are
/// kept too.
pub(crate) fn lower_camel_case(field: &str) -> String {
    let field = field.strip_prefix("r#").unwrap_or(field);
    let body = field.trim_start_matches('_');
    let mut out = "_".repeat(field.len() - body.len());
    for (index, word) in body.split('_').filter(|word| !word.is_empty()).enumerate() {
        let mut chars = word.chars();
        if index > 0
            && let Some(first) = chars.next()
        {
            out.extend(first.to_uppercase());
        }
        out.push_str(chars.as_str());
    }
    out
}

/// An attribute or capacity name: a C identifier of at most 32 characters, optionally
/// preceded by a DNS subdomain of at most 63 characters and `/`.
pub(crate) fn check_attribute_name(name: &str) -> Result<(), String> {
    let (domain, identifier) = match name.split_once('/') {
        Some((domain, identifier)) => (Some(domain), identifier),
        None => (None, name),
    };
    if name.is_empty() {
        return Err("attribute name must not be empty".to_owned());
    }
    if let Some(domain) = domain {
        let length = domain.chars().count();
        if length > MAX_ATTRIBUTE_DOMAIN {
            return Err(format!(
                "the domain of attribute name `{name}` is {length} characters long; at most {MAX_ATTRIBUTE_DOMAIN} are allowed"
            ));
        }
        if !is_dns_subdomain(domain) {
            return Err(format!(
                "`{domain}` is not a valid attribute domain: it must be a lowercase DNS subdomain such as `resource.kubernetes.io`"
            ));
        }
    }
    if !is_c_identifier(identifier) {
        let subject = if domain.is_some() {
            format!("`{identifier}` in attribute name `{name}`")
        } else {
            format!("attribute name `{name}`")
        };
        return Err(format!(
            "{subject} is not a C identifier: use letters, digits and `_`, not starting with a digit"
        ));
    }
    let length = identifier.chars().count();
    if length > MAX_IDENTIFIER {
        return Err(format!(
            "attribute name `{identifier}` is {length} characters long; at most {MAX_IDENTIFIER} are allowed"
        ));
    }
    Ok(())
}

/// `group/version` of an opaque config: the group a DNS subdomain, the version a DNS label
/// starting with a letter (`v1`, `v1beta1`).
pub(crate) fn check_api_version(api_version: &str) -> Result<(), String> {
    let Some((group, version)) = api_version.split_once('/') else {
        return Err(format!(
            "apiVersion `{api_version}` must be `<group>/<version>`, like `gpu.example.com/v1`: opaque configs belong to the driver's own API group"
        ));
    };
    if group.len() > MAX_API_GROUP || !is_dns_subdomain(group) {
        return Err(format!(
            "API group `{group}` in apiVersion `{api_version}` must be a lowercase DNS subdomain, like `gpu.example.com`"
        ));
    }
    let valid_version = version.len() <= MAX_LABEL
        && version.starts_with(|c: char| c.is_ascii_lowercase())
        && is_dns_label(version);
    if !valid_version {
        return Err(format!(
            "version `{version}` in apiVersion `{api_version}` must be a lowercase DNS label starting with a letter, like `v1` or `v1beta1`"
        ));
    }
    Ok(())
}

/// A kind: an UpperCamelCase ASCII identifier (`GpuConfig`).
pub(crate) fn check_kind(kind: &str) -> Result<(), String> {
    let valid = kind.len() <= MAX_LABEL
        && kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric());
    if valid {
        Ok(())
    } else {
        Err(format!(
            "kind `{kind}` must be an UpperCamelCase identifier of at most {MAX_LABEL} ASCII letters and digits, like `GpuConfig`"
        ))
    }
}

fn is_c_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_dns_subdomain(text: &str) -> bool {
    text.split('.')
        .all(|label| label.len() <= MAX_LABEL && is_dns_label(label))
}

/// RFC 1123 label: lowercase alphanumerics and `-`, starting and ending alphanumeric.
fn is_dns_label(label: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    label.starts_with(alphanumeric)
        && label.ends_with(alphanumeric)
        && label.chars().all(|c| alphanumeric(c) || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case() {
        for (field, name) in [
            ("index", "index"),
            ("driver_version", "driverVersion"),
            ("cuda_compute_capability", "cudaComputeCapability"),
            ("memory_slice_0", "memorySlice0"),
            ("r#type", "type"),
            ("pciBusID", "pciBusID"),
            ("_hidden_field", "_hiddenField"),
            ("double__under", "doubleUnder"),
            ("trailing_", "trailing"),
        ] {
            assert_eq!(lower_camel_case(field), name, "{field}");
        }
    }

    #[test]
    fn valid_attribute_names() {
        for name in [
            "index",
            "_x",
            "a1",
            "resource.kubernetes.io/pcieRoot",
            "gpu.nvidia.com/cudaDriverVersion",
            "example/x",
            "a-b.c/x",
            &"a".repeat(32),
            &format!("{}/x", "d".repeat(63)),
        ] {
            assert_eq!(check_attribute_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn invalid_attribute_names() {
        for (name, message) in [
            ("", "attribute name must not be empty"),
            (
                "pcie-root",
                "attribute name `pcie-root` is not a C identifier: use letters, digits and `_`, not starting with a digit",
            ),
            (
                "1st",
                "attribute name `1st` is not a C identifier: use letters, digits and `_`, not starting with a digit",
            ),
            (
                "a.b/c/d",
                "`c/d` in attribute name `a.b/c/d` is not a C identifier: use letters, digits and `_`, not starting with a digit",
            ),
            (
                "example.com/",
                "`` in attribute name `example.com/` is not a C identifier: use letters, digits and `_`, not starting with a digit",
            ),
            (
                "Example.com/x",
                "`Example.com` is not a valid attribute domain: it must be a lowercase DNS subdomain such as `resource.kubernetes.io`",
            ),
            (
                "-a.com/x",
                "`-a.com` is not a valid attribute domain: it must be a lowercase DNS subdomain such as `resource.kubernetes.io`",
            ),
            (
                "a..com/x",
                "`a..com` is not a valid attribute domain: it must be a lowercase DNS subdomain such as `resource.kubernetes.io`",
            ),
            (
                "/x",
                "`` is not a valid attribute domain: it must be a lowercase DNS subdomain such as `resource.kubernetes.io`",
            ),
            (
                &"a".repeat(33),
                "attribute name `aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa` is 33 characters long; at most 32 are allowed",
            ),
        ] {
            assert_eq!(
                check_attribute_name(name),
                Err(message.to_owned()),
                "{name}"
            );
        }
        let long_domain = format!("{}/x", "d".repeat(64));
        assert!(
            check_attribute_name(&long_domain)
                .unwrap_err()
                .contains("64 characters long; at most 63")
        );
    }

    #[test]
    fn api_versions() {
        for good in [
            "gpu.example.com/v1",
            "resource.nvidia.com/v1beta1",
            "a/v2alpha3",
        ] {
            assert_eq!(check_api_version(good), Ok(()), "{good}");
        }
        for bad in [
            "v1",
            "Gpu.example.com/v1",
            "gpu.example.com/V1",
            "gpu.example.com/1",
            "/v1",
            "a/",
            "a/v1/x",
            "a_b/v1",
        ] {
            assert!(check_api_version(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kinds() {
        for good in ["GpuConfig", "X", "MigDeviceConfig2"] {
            assert_eq!(check_kind(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "gpuConfig",
            "Gpu_Config",
            "Gpu-Config",
            "1Gpu",
            &"A".repeat(64),
        ] {
            assert!(check_kind(bad).is_err(), "{bad}");
        }
    }
}

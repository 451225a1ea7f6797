//! Names in derived code: attribute names from field names, and the compile-time check of
//! every name against the SDK's one copy of the Kubernetes name rules (`dra_sdk::k8s::NameRule`).
//!
//! A proc-macro crate cannot use the SDK (the SDK depends on it), so the check runs in the
//! user's crate instead: the derive expands to a `const` item that calls the rule (a `const fn`)
//! and panics with its reason, spanned to the name. The compiler reports that as an error on
//! the name: ``evaluation panicked: identifier may contain only letters, digits and '_'``.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote_spanned};

/// Attributes plus capacities of one device.
pub(crate) const MAX_DEVICE_ENTRIES: usize = 32;

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

/// A `const` item, spanned to `span`, that fails compilation when `name` breaks
/// `NameRule::<rule>`.
pub(crate) fn check_name(
    krate: &impl ToTokens,
    rule: TokenStream,
    name: &str,
    span: Span,
) -> TokenStream {
    quote_spanned! {span=>
        const _: () = if let ::core::result::Result::Err(reason) =
            #krate::k8s::NameRule::#rule.check(#name)
        {
            ::core::panic!("{}", reason)
        };
    }
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
}

//! `#[derive(OpaqueConfig)]`: the `apiVersion` and `kind` of a serde config type.

use darling::util::{Ignored, SpannedValue};
use darling::{FromDeriveInput, FromField, ast};
use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::parse::ParseStream;
use syn::{Attribute, DeriveInput, Ident, LitStr, Path, Token};

use crate::names::{check_name, lower_camel_case};

/// The keys the config registry consumes before decoding the rest of the object.
const TYPE_FIELDS: [&str; 2] = ["apiVersion", "kind"];

#[derive(FromDeriveInput)]
#[darling(
    attributes(dra),
    supports(struct_named, struct_newtype, enum_any),
    forward_attrs(serde)
)]
struct Input {
    ident: Ident,
    generics: syn::Generics,
    data: ast::Data<Ignored, Field>,
    attrs: Vec<Attribute>,
    /// Required; optional here to report its absence with an example.
    api_version: Option<SpannedValue<String>>,
    /// Required; optional here to report its absence with an example.
    kind: Option<SpannedValue<String>>,
    /// `hooks = false`: the type has no normalize/validate logic; write the empty impl.
    hooks: Option<bool>,
    /// Path of the dra-sdk crate, for users who renamed or re-export it.
    #[darling(rename = "crate")]
    krate: Option<Path>,
}

#[derive(FromField)]
#[darling(forward_attrs(serde))]
struct Field {
    ident: Option<Ident>,
    attrs: Vec<Attribute>,
}

pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    expand(input).unwrap_or_else(darling::Error::write_errors)
}

fn expand(input: &DeriveInput) -> darling::Result<TokenStream> {
    let input = Input::from_derive_input(input)?;
    let (Some(api_version), Some(kind)) = (&input.api_version, &input.kind) else {
        let missing = match (&input.api_version, &input.kind) {
            (None, None) => "apiVersion and kind",
            (None, Some(_)) => "apiVersion",
            _ => "kind",
        };
        return Err(darling::Error::custom(format!(
            "an opaque config needs its {missing}: add #[dra(api_version = \"<group>/<version>\", \
             kind = \"<Kind>\")], for example #[dra(api_version = \"gpu.example.com/v1\", \
             kind = \"GpuConfig\")]"
        ))
        .with_span(&input.ident));
    };
    check_type_fields(&input)?;
    let krate = input.krate.unwrap_or_else(|| syn::parse_quote!(::dra_sdk));
    let name_checks = [
        check_name(&krate, quote!(ApiVersion), api_version, api_version.span()),
        check_name(&krate, quote!(Kind), kind, kind.span()),
    ];
    let (api_version, kind) = (api_version.as_str(), kind.as_str());

    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    // Spanned to the type name, so that a missing `ConfigHooks` impl or `Deserialize` derive
    // is reported on the type rather than on the derive.
    let config_trait = quote_spanned!(ident.span()=> #krate::config::OpaqueConfig);
    let hooks = (input.hooks == Some(false)).then(|| {
        quote! {
            #[automatically_derived]
            impl #impl_generics #krate::config::ConfigHooks for #ident #ty_generics #where_clause {}
        }
    });
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #config_trait for #ident #ty_generics #where_clause {
            const API_VERSION: &'static str = #api_version;
            const KIND: &'static str = #kind;
        }
        #hooks
        #(#name_checks)*
    })
}

/// Rejects fields and enum tags that would read `apiVersion` or `kind`: the registry consumes
/// those keys, so such a field would never be set.
fn check_type_fields(input: &Input) -> darling::Result<()> {
    let mut errors = darling::Error::accumulator();
    let container = serde_items(&input.attrs);
    let rename_all = container
        .iter()
        .find(|item| item.key == "rename_all")
        .map(|item| item.value.as_str());
    for item in &container {
        if matches!(item.key.as_str(), "tag" | "content")
            && TYPE_FIELDS.contains(&item.value.as_str())
        {
            errors.push(
                darling::Error::custom(format!(
                    "`{}` cannot be the {}: {}",
                    item.value,
                    if item.key == "tag" {
                        "enum tag"
                    } else {
                        "enum content field"
                    },
                    CONSUMED,
                ))
                .with_span(&item.span),
            );
        }
    }

    if let ast::Data::Struct(fields) = &input.data {
        for field in &fields.fields {
            let Some(ident) = &field.ident else { continue };
            let items = serde_items(&field.attrs);
            if items
                .iter()
                .any(|item| matches!(item.key.as_str(), "flatten" | "skip" | "skip_deserializing"))
            {
                continue;
            }
            let mut names: Vec<(String, Span)> = items
                .iter()
                .filter(|item| matches!(item.key.as_str(), "rename" | "alias"))
                .map(|item| (item.value.clone(), item.span))
                .collect();
            if !items.iter().any(|item| item.key == "rename") {
                names.push((wire_name(&ident.to_string(), rename_all), ident.span()));
            }
            for (name, span) in names {
                if TYPE_FIELDS.contains(&name.as_str()) {
                    errors.push(
                        darling::Error::custom(format!(
                            "field `{ident}` is read from `{name}`, which cannot be a config field: {CONSUMED}; give it another name with #[serde(rename = \"...\")]"
                        ))
                        .with_span(&span),
                    );
                }
            }
        }
    }
    errors.finish()
}

const CONSUMED: &str =
    "the config registry consumes `apiVersion` and `kind` to select the type before decoding";

/// How serde names a field under the container's `rename_all`, as far as it matters here:
/// only the conventions that can produce `apiVersion` or `kind`.
fn wire_name(field: &str, rename_all: Option<&str>) -> String {
    let field = field.strip_prefix("r#").unwrap_or(field);
    match rename_all {
        Some("camelCase") => lower_camel_case(field),
        Some("lowercase") => field.to_lowercase(),
        Some("kebab-case") => field.replace('_', "-"),
        _ => field.to_owned(),
    }
}

/// One `key = "value"` (or bare `key`) item of a `#[serde(...)]` attribute. For
/// `rename(deserialize = "...")` the item is `rename` with the deserialize value.
struct SerdeItem {
    key: String,
    value: String,
    span: Span,
}

/// The items of the `#[serde(...)]` attributes that matter here. Anything else is skipped
/// without interpretation: serde itself reports malformed attributes.
fn serde_items(attrs: &[Attribute]) -> Vec<SerdeItem> {
    let mut items = Vec::new();
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("serde")) {
        // Malformed serde attributes are serde's to report, with its own message.
        let _ = attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(Ident::to_string)
                .unwrap_or_default();
            if meta.input.peek(Token![=]) {
                let value = meta.value()?;
                if value.peek(LitStr) {
                    let literal: LitStr = value.parse()?;
                    items.push(SerdeItem {
                        key,
                        value: literal.value(),
                        span: literal.span(),
                    });
                } else {
                    skip_value(value)?;
                }
            } else if meta.input.peek(syn::token::Paren) {
                // `rename(serialize = "..", deserialize = "..")`: only deserialization matters.
                meta.parse_nested_meta(|inner| {
                    if inner.input.peek(Token![=]) {
                        let value = inner.value()?;
                        if inner.path.is_ident("deserialize") && value.peek(LitStr) {
                            let literal: LitStr = value.parse()?;
                            items.push(SerdeItem {
                                key: key.clone(),
                                value: literal.value(),
                                span: literal.span(),
                            });
                        } else {
                            skip_value(value)?;
                        }
                    }
                    Ok(())
                })?;
            } else {
                items.push(SerdeItem {
                    key,
                    value: String::new(),
                    span: meta
                        .path
                        .get_ident()
                        .map_or_else(Span::call_site, Ident::span),
                });
            }
            Ok(())
        });
    }
    items
}

fn skip_value(input: ParseStream<'_>) -> syn::Result<()> {
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<TokenTree>()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(input: TokenStream) -> String {
        derive(&syn::parse2(input).unwrap()).to_string()
    }

    #[test]
    fn expands_constants() {
        let out = expand_str(quote! {
            #[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig")]
            struct GpuConfig { sharing: Option<Sharing> }
        });
        assert!(out.contains("impl :: dra_sdk :: config :: OpaqueConfig for GpuConfig"));
        assert!(out.contains("const API_VERSION : & 'static str = \"gpu.example.com/v1\" ;"));
        assert!(out.contains("const KIND : & 'static str = \"GpuConfig\" ;"));
        assert!(!out.contains("ConfigHooks"));
    }

    #[test]
    fn hooks_false_writes_empty_hooks() {
        let out = expand_str(quote! {
            #[dra(api_version = "a.b/v1", kind = "C", hooks = false, crate = "sdk")]
            enum C { A, B }
        });
        assert!(
            out.contains("impl sdk :: config :: ConfigHooks for C { }"),
            "{out}"
        );
    }

    #[test]
    fn type_field_collisions() {
        let out = expand_str(quote! {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            #[dra(api_version = "a.b/v1", kind = "C")]
            struct C {
                api_version: String,
                #[serde(rename(serialize = "x", deserialize = "kind"), default)]
                sort: String,
                #[serde(alias = "kind", default = "String::new")]
                other: String,
                #[serde(flatten)]
                kind: Extra,
                #[serde(rename = "type")]
                r#kind2: String,
            }
        });
        assert_eq!(out.matches("compile_error").count(), 3, "{out}");
        assert!(out.contains("field `api_version` is read from `apiVersion`"));
        assert!(out.contains("field `sort` is read from `kind`"));
        assert!(out.contains("field `other` is read from `kind`"));
    }

    #[test]
    fn enum_tag_collision() {
        let out = expand_str(quote! {
            #[serde(tag = "kind")]
            #[dra(api_version = "a.b/v1", kind = "C")]
            enum C { A {} }
        });
        assert!(out.contains("`kind` cannot be the enum tag"), "{out}");
    }

    /// The identity is checked by the SDK's name rules, at compile time in the user's crate
    /// (the UI test `config_invalid_identity` shows the errors).
    #[test]
    fn identity_is_checked_by_the_name_rules() {
        let out = expand_str(quote! {
            #[dra(api_version = "v1", kind = "gpuConfig")]
            struct C {}
        });
        assert!(
            out.contains("NameRule :: ApiVersion . check (\"v1\")"),
            "{out}"
        );
        assert!(
            out.contains("NameRule :: Kind . check (\"gpuConfig\")"),
            "{out}"
        );
    }
}

//! `#[derive(DeviceAttributes)]`: one struct field per device attribute or capacity.

use std::collections::{BTreeMap, BTreeSet};

use darling::util::{Flag, SpannedValue};
use darling::{FromDeriveInput, FromField, ast};
use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, Ident, Path, Type};

use crate::names::{MAX_DEVICE_ENTRIES, check_name, lower_camel_case};

#[derive(FromDeriveInput)]
#[darling(attributes(dra), supports(struct_named))]
struct Input {
    ident: Ident,
    generics: syn::Generics,
    data: ast::Data<(), Field>,
    /// Path of the dra-sdk crate, for users who renamed or re-export it.
    #[darling(rename = "crate")]
    krate: Option<Path>,
}

#[derive(FromField)]
#[darling(attributes(dra))]
struct Field {
    ident: Option<Ident>,
    ty: Type,
    /// Explicit name, possibly qualified (`resource.kubernetes.io/pcieRoot`).
    name: Option<SpannedValue<String>>,
    /// A capacity rather than an attribute.
    capacity: Flag,
    /// A nested `DeviceAttributes` value whose entries are added as they are.
    flatten: Flag,
    /// Not published.
    skip: Flag,
}

/// What a field contributes.
enum Role {
    Attribute,
    Capacity,
    Flatten,
}

pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    expand(input).unwrap_or_else(darling::Error::write_errors)
}

fn expand(input: &DeriveInput) -> darling::Result<TokenStream> {
    let input = Input::from_derive_input(input)?;
    let krate = input.krate.unwrap_or_else(|| syn::parse_quote!(::dra_sdk));
    let fields = match input.data {
        ast::Data::Struct(fields) => fields.fields,
        // `supports(struct_named)` has already rejected enums.
        ast::Data::Enum(_) => return Err(darling::Error::unsupported_shape("enum")),
    };

    let mut errors = darling::Error::accumulator();
    let published: Vec<(&Field, &Ident, Role)> = fields
        .iter()
        .filter_map(|field| {
            let ident = field.ident.as_ref()?;
            errors
                .handle(role(field))
                .flatten()
                .map(|role| (field, ident, role))
        })
        .collect();

    let total = published
        .iter()
        .filter(|(_, _, role)| !matches!(role, Role::Flatten))
        .count();
    let device = Ident::new("__dra_device", Span::mixed_site());
    let type_params: BTreeSet<String> = input
        .generics
        .type_params()
        .map(|param| param.ident.to_string())
        .collect();
    let mut names: BTreeMap<String, &Ident> = BTreeMap::new();
    let mut statements = Vec::new();
    let mut name_checks = Vec::new();
    let mut bounds = Vec::new();
    let mut counted = 0;

    for (field, field_ident, role) in &published {
        let ty = &field.ty;
        let span = ty.span();
        // The whole call carries the field type's span, so that an unsupported type is
        // reported on that type alone (the crate path would otherwise stretch the error from
        // `#[dra(crate = ...)]` to the field).
        let krate = respan(krate.to_token_stream(), span);
        let mut ident = (*field_ident).clone();
        ident.set_span(span);
        let trait_path = match role {
            Role::Attribute => quote!(#krate::attributes::ToAttributeValue),
            Role::Capacity => quote!(#krate::attributes::ToCapacity),
            Role::Flatten => quote!(#krate::slices::DeviceAttributes),
        };
        if mentions_any(ty.to_token_stream(), &type_params) {
            bounds.push(quote!(#ty: #trait_path));
        }
        if let Role::Flatten = role {
            statements.push(quote_spanned! {span=>
                #krate::slices::DeviceAttributes::apply_to(&self.#ident, #device);
            });
            continue;
        }

        counted += 1;
        if counted == MAX_DEVICE_ENTRIES + 1 {
            errors.push(
                darling::Error::custom(format!(
                    "`{}` has {total} attributes and capacities; a device may have at most {MAX_DEVICE_ENTRIES}",
                    input.ident
                ))
                .with_span(*field_ident),
            );
        }

        let (name, name_span) = match &field.name {
            Some(name) => (name.as_str().to_owned(), name.span()),
            None => (
                lower_camel_case(&field_ident.to_string()),
                field_ident.span(),
            ),
        };
        name_checks.push(check_name(&krate, quote!(QualifiedName), &name, name_span));
        if let Some(first) = names.insert(name.clone(), field_ident) {
            errors.push(
                darling::Error::custom(format!(
                    "attribute name `{name}` is already used by field `{first}`"
                ))
                .with_span(&name_span),
            );
            continue;
        }

        let setter = match role {
            Role::Capacity => quote_spanned!(span=> set_capacity),
            _ => quote_spanned!(span=> set_attribute),
        };
        statements.push(quote_spanned! {span=>
            #krate::attributes::__private::#setter(#device, #name, &self.#ident);
        });
    }
    errors.finish()?;

    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let where_clause = with_bounds(where_clause, &bounds);
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #krate::slices::DeviceAttributes for #ident #ty_generics #where_clause {
            fn apply_to(&self, #device: &mut #krate::slices::Device) {
                #(#statements)*
            }
        }
        #(#name_checks)*
    })
}

/// The field's role, `None` for skipped fields, or an error for contradictory options.
fn role(field: &Field) -> darling::Result<Option<Role>> {
    if field.skip.is_present() {
        let other = [field.capacity, field.flatten]
            .into_iter()
            .find(Flag::is_present)
            .map(|flag| flag.span())
            .or(field.name.as_ref().map(SpannedValue::span));
        return match other {
            Some(span) => Err(darling::Error::custom(
                "a skipped field is not published: `skip` cannot be combined with `name`, `capacity` or `flatten`",
            )
            .with_span(&span)),
            None => Ok(None),
        };
    }
    if field.flatten.is_present() {
        let other = [field.capacity]
            .into_iter()
            .find(Flag::is_present)
            .map(|flag| flag.span())
            .or(field.name.as_ref().map(SpannedValue::span));
        return match other {
            Some(span) => Err(darling::Error::custom(
                "a flattened field publishes the entries of its own type: `flatten` cannot be combined with `name` or `capacity`",
            )
            .with_span(&span)),
            None => Ok(Some(Role::Flatten)),
        };
    }
    Ok(Some(if field.capacity.is_present() {
        Role::Capacity
    } else {
        Role::Attribute
    }))
}

/// `tokens` with every span, nested ones included, set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// Whether `tokens` name one of the struct's type parameters, so that the field's trait
/// bound belongs in the impl's where clause.
fn mentions_any(tokens: TokenStream, type_params: &BTreeSet<String>) -> bool {
    !type_params.is_empty()
        && tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => type_params.contains(&ident.to_string()),
            TokenTree::Group(group) => mentions_any(group.stream(), type_params),
            TokenTree::Punct(_) | TokenTree::Literal(_) => false,
        })
}

fn with_bounds(where_clause: Option<&syn::WhereClause>, bounds: &[TokenStream]) -> TokenStream {
    if bounds.is_empty() {
        return where_clause.to_token_stream();
    }
    let existing = where_clause.map(|clause| {
        let predicates = &clause.predicates;
        quote!(#predicates,)
    });
    quote!(where #existing #(#bounds,)*)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(input: TokenStream) -> String {
        derive(&syn::parse2(input).unwrap()).to_string()
    }

    #[test]
    fn expands_attributes_capacities_and_flatten() {
        let out = expand_str(quote! {
            struct Gpu {
                index: i64,
                driver_version: Version,
                #[dra(name = "resource.kubernetes.io/pcieRoot")]
                pcie_root: Option<String>,
                #[dra(capacity)]
                memory: Quantity,
                #[dra(flatten)]
                common: Common,
                #[dra(skip)]
                handle: Handle,
            }
        });
        assert!(out.contains("impl :: dra_sdk :: slices :: DeviceAttributes for Gpu"));
        assert!(out.contains(
            ":: dra_sdk :: attributes :: __private :: set_attribute (__dra_device , \"index\" , & self . index)"
        ));
        assert!(out.contains(
            "set_attribute (__dra_device , \"driverVersion\" , & self . driver_version)"
        ));
        assert!(out.contains(
            "set_attribute (__dra_device , \"resource.kubernetes.io/pcieRoot\" , & self . pcie_root)"
        ));
        assert!(out.contains("set_capacity (__dra_device , \"memory\" , & self . memory)"));
        assert!(out.contains(
            ":: dra_sdk :: slices :: DeviceAttributes :: apply_to (& self . common , __dra_device)"
        ));
        assert!(!out.contains("handle"));
    }

    #[test]
    fn crate_path_override() {
        let out = expand_str(quote! {
            #[dra(crate = "my::sdk")]
            struct Gpu { index: i64 }
        });
        assert!(out.contains("impl my :: sdk :: slices :: DeviceAttributes for Gpu"));
        assert!(out.contains("my :: sdk :: attributes :: __private :: set_attribute"));
        assert!(!out.contains("dra_sdk"));
    }

    #[test]
    fn generic_fields_get_bounds() {
        let out = expand_str(quote! {
            struct Gpu<T, U: Clone> where U: Default {
                id: T,
                #[dra(capacity)]
                memory: Option<U>,
                plain: i64,
            }
        });
        assert!(out.contains(
            "where U : Default , T : :: dra_sdk :: attributes :: ToAttributeValue , Option < U > : :: dra_sdk :: attributes :: ToCapacity ,"
        ));
        assert!(!out.contains("i64 :"));
    }

    #[test]
    fn errors_are_accumulated() {
        let out = expand_str(quote! {
            struct Gpu {
                #[dra(name = "bad-name")]
                a: i64,
                #[dra(name = "index")]
                b: i64,
                index: i64,
                #[dra(skip, capacity)]
                c: i64,
            }
        });
        // The name rules run later, at compile time in the user's crate (`names::check_name`).
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        assert!(out.contains("attribute name `index` is already used by field `b`"));
        assert!(out.contains("`skip` cannot be combined"));
    }

    #[test]
    fn limit_counts_attributes_and_capacities_not_flattened_fields() {
        let fields = (0..MAX_DEVICE_ENTRIES).map(|i| {
            let ident = quote::format_ident!("f{i}");
            quote!(#ident: i64,)
        });
        let out = expand_str(quote! {
            struct Full { #(#fields)* #[dra(flatten)] more: More, #[dra(skip)] x: X }
        });
        assert!(!out.contains("compile_error"), "{out}");

        let fields = (0..=MAX_DEVICE_ENTRIES).map(|i| {
            let ident = quote::format_ident!("f{i}");
            quote!(#ident: i64,)
        });
        let out = expand_str(quote!(struct TooMany { #(#fields)* }));
        assert!(
            out.contains(
                "`TooMany` has 33 attributes and capacities; a device may have at most 32"
            )
        );
    }
}

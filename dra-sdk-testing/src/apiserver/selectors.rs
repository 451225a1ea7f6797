//! Field and label selectors as the API server parses and applies them.

use std::collections::BTreeSet;

use serde_json::Value;

use super::object::{field_value, lookup};
use super::resources::ResourceType;

/// `fieldSelector`: comma-joined `field=value`, `field==value` or `field!=value` terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector {
    terms: Vec<(String, bool, String)>, // (field, equal, value)
}

impl FieldSelector {
    /// Parses a selector, refusing fields the kind does not index (the real server answers
    /// 400 "field label not supported").
    pub(crate) fn parse(input: &str, rt: &ResourceType) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in input.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                ));
            };
            let field = field.trim();
            if !rt.supports_field(field) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self { terms })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.terms
            .iter()
            .all(|(field, equal, value)| (field_value(obj, field) == *value) == *equal)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

/// `labelSelector`: equality (`=`, `==`, `!=`) and set-based (`in`, `notin`, `key`, `!key`)
/// requirements, comma-joined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub(crate) fn parse(input: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for term in split_top_level(input)
            .into_iter()
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            requirements.push(parse_requirement(term).ok_or_else(|| {
                format!("unable to parse requirement: <{term}> in label selector \"{input}\"")
            })?);
        }
        Ok(Self { requirements })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = lookup(obj, "metadata.labels").and_then(Value::as_object);
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|req| match req {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, set) => label(k).is_some_and(|v| set.contains(v)),
            Requirement::NotIn(k, set) => label(k).is_none_or(|v| !set.contains(v)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

/// Splits on commas that are not inside `( … )`.
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (index, ch) in input.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&input[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

fn parse_requirement(term: &str) -> Option<Requirement> {
    let valid_key = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    };
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        return valid_key(key).then(|| Requirement::DoesNotExist(key.to_string()));
    }
    if let Some((key, value)) = term.split_once("!=") {
        let key = key.trim();
        return valid_key(key)
            .then(|| Requirement::NotEquals(key.to_string(), value.trim().to_string()));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        let key = key.trim();
        return valid_key(key)
            .then(|| Requirement::Equals(key.to_string(), value.trim().to_string()));
    }
    let mut words = term.splitn(2, char::is_whitespace);
    let key = words.next()?.trim();
    let rest = words.next().map(str::trim).unwrap_or_default();
    if !valid_key(key) {
        return None;
    }
    if rest.is_empty() {
        return Some(Requirement::Exists(key.to_string()));
    }
    let (negated, set) = if let Some(set) = rest.strip_prefix("notin") {
        (true, set)
    } else if let Some(set) = rest.strip_prefix("in") {
        (false, set)
    } else {
        return None;
    };
    let inner = set.trim().strip_prefix('(')?.strip_suffix(')')?;
    let values: BTreeSet<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    Some(if negated {
        Requirement::NotIn(key.to_string(), values)
    } else {
        Requirement::In(key.to_string(), values)
    })
}

/// Everything that narrows a list, watch or delete-collection: namespace and both selectors.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filter {
    pub(crate) namespace: Option<String>,
    pub(crate) fields: FieldSelector,
    pub(crate) labels: LabelSelector,
}

impl Filter {
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let namespace_ok = self
            .namespace
            .as_deref()
            .is_none_or(|ns| lookup(obj, "metadata.namespace").and_then(Value::as_str) == Some(ns));
        namespace_ok && self.fields.matches(obj) && self.labels.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(node: &str, driver: &str) -> Value {
        json!({"metadata": {"name": "s", "labels": {"tier": "gpu", "zone": "a"}},
               "spec": {"nodeName": node, "driver": driver}})
    }

    #[test]
    fn field_selector_operators() {
        let rt = ResourceType::RESOURCE_SLICES;
        let sel =
            FieldSelector::parse("spec.nodeName=n1,spec.driver==gpu.example.com", &rt).unwrap();
        assert!(sel.matches(&slice("n1", "gpu.example.com")));
        assert!(!sel.matches(&slice("n2", "gpu.example.com")));
        let sel = FieldSelector::parse("spec.nodeName!=n1", &rt).unwrap();
        assert!(sel.matches(&slice("n2", "d")));
        assert!(
            FieldSelector::parse("", &rt)
                .unwrap()
                .matches(&slice("x", "y"))
        );
        assert!(
            FieldSelector::parse("metadata.name=s", &rt)
                .unwrap()
                .matches(&slice("x", "y"))
        );
    }

    #[test]
    fn field_selector_rejects_unknown_fields() {
        let err =
            FieldSelector::parse("spec.driver=x", &ResourceType::RESOURCE_CLAIMS).unwrap_err();
        assert_eq!(err, "field label not supported: spec.driver");
        assert!(FieldSelector::parse("spec.driver", &ResourceType::RESOURCE_SLICES).is_err());
    }

    #[test]
    fn label_selector_forms() {
        let obj = slice("n", "d");
        for (selector, expected) in [
            ("tier=gpu", true),
            ("tier==gpu,zone=a", true),
            ("tier!=gpu", false),
            ("tier in (gpu, cpu)", true),
            ("zone notin (a)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("missing notin (x)", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(selector).unwrap().matches(&obj),
                expected,
                "{selector}"
            );
        }
        assert!(LabelSelector::parse("tier in gpu").is_err());
        assert!(LabelSelector::parse("a b c").is_err());
    }

    #[test]
    fn filter_checks_namespace() {
        let filter = Filter {
            namespace: Some("ns".into()),
            ..Filter::default()
        };
        assert!(filter.matches(&json!({"metadata": {"namespace": "ns"}})));
        assert!(!filter.matches(&json!({"metadata": {"namespace": "other"}})));
    }
}

//! Node selectors, evaluated against a node's name and labels.

use std::collections::BTreeMap;

use super::model::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// A node as selectors see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeView<'a> {
    pub(crate) name: &'a str,
    pub(crate) labels: &'a BTreeMap<String, String>,
}

/// Whether the node matches: any term matches, and a term matches when all its requirements do.
/// A term without requirements matches nothing, as in Kubernetes.
pub(crate) fn selector_matches(selector: &NodeSelector, node: NodeView<'_>) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node))
}

fn term_matches(term: &NodeSelectorTerm, node: NodeView<'_>) -> bool {
    if term.match_expressions.is_empty() && term.match_fields.is_empty() {
        return false;
    }
    term.match_expressions.iter().all(|requirement| {
        requirement_matches(
            requirement,
            node.labels.get(&requirement.key).map(String::as_str),
        )
    }) && term.match_fields.iter().all(|requirement| {
        // `metadata.name` is the only field Kubernetes supports in node selectors.
        let value = (requirement.key == "metadata.name").then_some(node.name);
        requirement_matches(requirement, value)
    })
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let number = |text: &str| text.parse::<i64>().ok();
    let bound = || match requirement.values.as_slice() {
        [single] => number(single),
        _ => None,
    };
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|value| requirement.values.iter().any(|v| v == value)),
        "NotIn" => value.is_none_or(|value| !requirement.values.iter().any(|v| v == value)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), bound()), (Some(value), Some(bound)) if value > bound)
        }
        "Lt" => {
            matches!((value.and_then(number), bound()), (Some(value), Some(bound)) if value < bound)
        }
        // Unknown operators match nothing rather than everything.
        _ => false,
    }
}

/// Whether a claim allocated by the scheduler can be used on the node: its `nodeSelector`
/// matches the node's name and labels, or it has none (devices available on all nodes). The
/// scheduler only puts a pod whose claims are already allocated on such nodes.
pub fn allocation_fits_node(
    allocation: &k8s_openapi::api::resource::v1::AllocationResult,
    node: &k8s_openapi::api::core::v1::Node,
) -> bool {
    let Some(selector) = &allocation.node_selector else {
        return true;
    };
    // Decoded into the allocator's own shape, which is the same in every Kubernetes version;
    // a selector that does not decode cannot have been written by the scheduler.
    let Ok(selector) = super::model::decode::<NodeSelector>(selector) else {
        return false;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let view = NodeView {
        name: node.metadata.name.as_deref().unwrap_or(""),
        labels: &labels,
    };
    selector_matches(&selector, view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(value: serde_json::Value) -> NodeSelector {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn expressions_fields_and_terms() {
        let labels = BTreeMap::from([
            ("zone".to_owned(), "a".to_owned()),
            ("gpus".to_owned(), "4".to_owned()),
        ]);
        let node = NodeView {
            name: "node-1",
            labels: &labels,
        };
        let cases = [
            (
                serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}),
                true,
            ),
            (
                serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}]}),
                false,
            ),
            (
                serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "DoesNotExist"}]}]}),
                true,
            ),
            (
                serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["3"]}]}]}),
                true,
            ),
            (
                serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["3"]}]}]}),
                false,
            ),
            (
                serde_json::json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}),
                true,
            ),
            (
                serde_json::json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}, {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]}),
                true,
            ),
            (serde_json::json!({"nodeSelectorTerms": [{}]}), false),
            (serde_json::json!({"nodeSelectorTerms": []}), false),
        ];
        for (value, expected) in cases {
            assert_eq!(
                selector_matches(&selector(value.clone()), node),
                expected,
                "{value}"
            );
        }
    }
}

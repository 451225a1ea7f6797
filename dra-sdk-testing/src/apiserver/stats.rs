//! Request counters by verb and resource.

use std::collections::BTreeMap;
use std::fmt;

/// A Kubernetes API verb, as the server classifies a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// GET of one object (or its `/status`).
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH, including server-side apply.
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

impl Verb {
    /// The verb as Kubernetes spells it (`deletecollection`, `watch`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    /// Whether the verb changes state.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many requests of each verb arrived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerbCounts {
    /// Single-object reads.
    pub get: u64,
    /// Collection reads.
    pub list: u64,
    /// Watch requests (each started watch counts once).
    pub watch: u64,
    /// Creates.
    pub create: u64,
    /// Updates (PUT).
    pub update: u64,
    /// Patches, server-side apply included.
    pub patch: u64,
    /// Single-object deletes.
    pub delete: u64,
    /// Collection deletes.
    pub delete_collection: u64,
}

impl VerbCounts {
    /// Count for one verb.
    pub fn count(&self, verb: Verb) -> u64 {
        match verb {
            Verb::Get => self.get,
            Verb::List => self.list,
            Verb::Watch => self.watch,
            Verb::Create => self.create,
            Verb::Update => self.update,
            Verb::Patch => self.patch,
            Verb::Delete => self.delete,
            Verb::DeleteCollection => self.delete_collection,
        }
    }

    fn slot(&mut self, verb: Verb) -> &mut u64 {
        match verb {
            Verb::Get => &mut self.get,
            Verb::List => &mut self.list,
            Verb::Watch => &mut self.watch,
            Verb::Create => &mut self.create,
            Verb::Update => &mut self.update,
            Verb::Patch => &mut self.patch,
            Verb::Delete => &mut self.delete,
            Verb::DeleteCollection => &mut self.delete_collection,
        }
    }

    /// Creates, updates, patches, deletes and delete-collections.
    pub fn writes(&self) -> u64 {
        self.create + self.update + self.patch + self.delete + self.delete_collection
    }

    /// Gets, lists and watches.
    pub fn reads(&self) -> u64 {
        self.get + self.list + self.watch
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.reads() + self.writes()
    }
}

/// A snapshot of the request counters since start or the last reset.
///
/// Every request routed to a resource counts, including ones a fault failed and ones the server
/// rejected; discovery and `/version` do not count. Requests to a subresource are counted under
/// `resource/subresource` (e.g. `resourceclaims/status`), separately from the resource itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// All resources together.
    pub total: VerbCounts,
    /// Per resource (`resourceslices`, `resourceclaims/status`, `nodes`, ...).
    pub by_resource: BTreeMap<String, VerbCounts>,
}

impl Stats {
    /// Counts for one resource (all zero when it saw no request).
    pub fn resource(&self, resource: &str) -> VerbCounts {
        self.by_resource.get(resource).copied().unwrap_or_default()
    }

    /// Total writes over all resources.
    pub fn writes(&self) -> u64 {
        self.total.writes()
    }

    pub(crate) fn record(&mut self, resource: &str, verb: Verb) {
        *self.total.slot(verb) += 1;
        *self
            .by_resource
            .entry(resource.to_string())
            .or_default()
            .slot(verb) += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_resource() {
        let mut stats = Stats::default();
        stats.record("resourceslices", Verb::Create);
        stats.record("resourceslices", Verb::List);
        stats.record("resourceclaims/status", Verb::Patch);
        assert_eq!(stats.writes(), 2);
        assert_eq!(stats.resource("resourceslices").writes(), 1);
        assert_eq!(stats.resource("resourceslices").total(), 2);
        assert_eq!(stats.resource("nodes"), VerbCounts::default());
        assert_eq!(stats.total.count(Verb::Patch), 1);
        assert!(Verb::DeleteCollection.is_write());
        assert_eq!(Verb::DeleteCollection.to_string(), "deletecollection");
    }
}

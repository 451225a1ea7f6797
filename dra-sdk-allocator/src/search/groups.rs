//! Compatibility groups (`consumesCounters[].compatibilityGroups`, Kubernetes 1.37, feature gate
//! `DRADeviceCompatibilityGroups`): which devices drawing from one counter set may be allocated
//! at the same time.
//!
//! The rule, as kube-scheduler's allocator applies it: per counter set of a pool, the groups of
//! all devices placed on it (devices other claims hold, their groups read from the slices as
//! published now, then the devices this claim takes) must have a non-empty intersection. A
//! device without groups (unset or empty) only goes with other devices without groups, so "all
//! placed devices had none" is a state of its own, not the empty intersection. Devices drawing
//! from different counter sets are never compared.

use std::collections::BTreeSet;
use std::fmt;

/// What the devices placed on one counter set so far have in common.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Intersection {
    /// Nothing placed yet: any device is admitted.
    #[default]
    Unplaced,
    /// Every device placed declared no groups: only devices without groups are admitted.
    NoGroups,
    /// The groups every placed device declared.
    Groups(BTreeSet<String>),
}

impl Intersection {
    /// Whether a device declaring `groups` (empty: none) may join the devices placed so far.
    pub(crate) fn admits(&self, groups: &BTreeSet<String>) -> bool {
        match self {
            Intersection::Unplaced => true,
            Intersection::NoGroups => groups.is_empty(),
            Intersection::Groups(common) => !common.is_disjoint(groups),
        }
    }

    /// The state once a device declaring `groups` is placed. Devices of other claims are folded
    /// in without [`Self::admits`]: a slice updated after their allocation may disagree, and a
    /// device without groups next to one with groups then leaves the state as it was, as in
    /// the scheduler.
    pub(crate) fn with(&self, groups: &BTreeSet<String>) -> Intersection {
        match self {
            Intersection::Unplaced if groups.is_empty() => Intersection::NoGroups,
            Intersection::Unplaced => Intersection::Groups(groups.clone()),
            Intersection::NoGroups => Intersection::NoGroups,
            Intersection::Groups(_) if groups.is_empty() => self.clone(),
            Intersection::Groups(common) => {
                Intersection::Groups(common.intersection(groups).cloned().collect())
            }
        }
    }
}

impl fmt::Display for Intersection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Intersection::Unplaced => f.write_str("nothing"),
            Intersection::NoGroups => f.write_str("no groups"),
            Intersection::Groups(groups) if groups.is_empty() => f.write_str("no common group"),
            Intersection::Groups(groups) => {
                let names: Vec<&str> = groups.iter().map(String::as_str).collect();
                write!(f, "groups {}", names.join(", "))
            }
        }
    }
}

/// A device whose compatibility groups rule it out next to the devices on one of its counter
/// sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupConflict {
    /// The counter set.
    pub(crate) set: String,
    /// The device's groups on it (empty: none).
    pub(crate) groups: BTreeSet<String>,
    /// What the devices already placed there have in common.
    pub(crate) placed: Intersection,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(groups: &[&str]) -> BTreeSet<String> {
        groups.iter().map(|g| (*g).to_owned()).collect()
    }

    #[test]
    fn groups_must_keep_a_common_member() {
        let first = Intersection::Unplaced.with(&set(&["a", "b"]));
        assert!(first.admits(&set(&["b", "c"])));
        let second = first.with(&set(&["b", "c"]));
        assert_eq!(second, Intersection::Groups(set(&["b"])));
        assert!(!second.admits(&set(&["a"])), "a left the intersection");
        assert!(!second.admits(&set(&[])), "no groups next to groups");
    }

    #[test]
    fn no_groups_go_only_with_no_groups() {
        let none = Intersection::Unplaced.with(&set(&[]));
        assert_eq!(none, Intersection::NoGroups);
        assert!(none.admits(&set(&[])));
        assert!(!none.admits(&set(&["a"])));
        assert!(Intersection::Unplaced.admits(&set(&["a"])));
        assert_eq!(none.to_string(), "no groups");
        assert_eq!(
            Intersection::Groups(set(&["x", "y"])).to_string(),
            "groups x, y"
        );
    }
}

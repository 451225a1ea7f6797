//! The pure part of reconciling: from desired resources and observed slices to the writes
//! that make them equal.
//!
//! # Generations
//!
//! Consumers use only the slices of a pool's highest generation and treat a pool as
//! incomplete until they see `resourceSliceCount` slices of it. So for each pool, with `G` the
//! highest generation among its current slices:
//!
//! * The pool keeps `G` when its slice count stays the same, at most one slice that consumers
//!   currently see at `G` has to change (an update, a delete, or a delete-and-recreate), and
//!   the driver did not ask for a higher generation. Any number of missing or older-generation
//!   slices may be (re)written at `G` along the way: consumers see the pool as incomplete
//!   until they are there.
//! * Otherwise every slice is rewritten with `max(G + 1, Pool::generation)`.
//! * A pool without slices starts at `Pool::generation`, or 0.
//!
//! Writes are ordered deletes, updates, creates, so a device moving between slices is never
//! visible twice in one complete generation.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1 as api;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::layout::{self, PreviousSlice};
use super::limits::SliceLimits;
use super::model::{DriverResources, Pool, PoolNodeSelection};
use super::slice_names;
use super::validate::{FieldPath, Problem, ValidationError, ValidationErrors};
use super::wire::{self, FeatureGate};

/// What the plan needs to know about the publisher.
pub(crate) struct PlanContext<'a> {
    /// The driver name.
    pub(crate) driver: &'a str,
    /// The node of a node-local publisher.
    pub(crate) node: Option<&'a str>,
    /// The owner reference every slice carries (the Node for node-local publishers).
    pub(crate) owner: Option<&'a OwnerReference>,
    /// The server's limits.
    pub(crate) limits: &'a SliceLimits,
    /// Feature gates the server was seen to have disabled.
    pub(crate) disabled: &'a BTreeSet<FeatureGate>,
    /// Whether slices with devices carry `skipNodeOperations`.
    pub(crate) skip_node_operations: bool,
}

/// A slice to delete, with the preconditions that protect a newer version of it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Delete {
    pub(crate) name: String,
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
}

/// The writes that make the observed slices match the desired resources.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Slices to delete first.
    pub(crate) deletes: Vec<Delete>,
    /// Slices to replace (with `metadata.resourceVersion` of the observed object).
    pub(crate) updates: Vec<api::ResourceSlice>,
    /// Slices to create last.
    pub(crate) creates: Vec<api::ResourceSlice>,
    /// Pools that failed validation; their slices are left alone.
    pub(crate) invalid: BTreeMap<String, ValidationErrors>,
    /// The layout of every valid pool, for the next plan's sticky assignment.
    pub(crate) layouts: BTreeMap<String, Vec<PreviousSlice>>,
}

impl Plan {
    /// Whether nothing needs writing.
    pub(crate) fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.updates.is_empty() && self.creates.is_empty()
    }

    /// Number of writes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.deletes.len() + self.updates.len() + self.creates.len()
    }
}

/// The validated, converted devices of every desired pool: everything about a plan that
/// depends only on the desired resources, kept while they do not change.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    pools: BTreeMap<String, Result<Vec<api::Device>, ValidationErrors>>,
}

/// Validates every pool and converts the devices of the valid ones.
pub(crate) fn prepare(ctx: &PlanContext<'_>, desired: &DriverResources) -> Prepared {
    Prepared {
        pools: desired
            .pools
            .iter()
            .map(|(name, pool)| {
                let converted = validate_pool(ctx, name, pool)
                    .map(|()| pool.devices.iter().map(wire::device_to_api).collect());
                (name.clone(), converted)
            })
            .collect(),
    }
}

/// Computes the plan.
///
/// `observed` holds every slice the publisher manages (its watch, filtered to its scope);
/// `memory` the layouts of the previous plan.
#[cfg(test)]
pub(crate) fn plan(
    ctx: &PlanContext<'_>,
    desired: &DriverResources,
    observed: &BTreeMap<String, api::ResourceSlice>,
    memory: &BTreeMap<String, Vec<PreviousSlice>>,
) -> Plan {
    plan_prepared(ctx, desired, &prepare(ctx, desired), observed, memory)
}

/// Computes the plan from resources already [prepared](prepare) with the same context.
pub(crate) fn plan_prepared(
    ctx: &PlanContext<'_>,
    desired: &DriverResources,
    prepared: &Prepared,
    observed: &BTreeMap<String, api::ResourceSlice>,
    memory: &BTreeMap<String, Vec<PreviousSlice>>,
) -> Plan {
    let mut plan = Plan::default();
    let mut by_pool: BTreeMap<&str, Vec<&api::ResourceSlice>> = BTreeMap::new();
    for slice in observed.values() {
        by_pool
            .entry(slice.spec.pool.name.as_str())
            .or_default()
            .push(slice);
    }

    for (pool_name, pool) in &desired.pools {
        let current = by_pool.remove(pool_name.as_str()).unwrap_or_default();
        match prepared.pools.get(pool_name) {
            Some(Ok(devices)) if devices.len() == pool.devices.len() => plan_pool(
                ctx,
                pool_name,
                pool,
                devices,
                &current,
                memory.get(pool_name),
                &mut plan,
            ),
            Some(Err(errors)) => {
                plan.invalid.insert(pool_name.clone(), errors.clone());
            }
            // Prepared from other resources (a caller bug): prepare this pool now rather than
            // publish it unvalidated.
            Some(Ok(_)) | None => match validate_pool(ctx, pool_name, pool) {
                Ok(()) => {
                    let devices: Vec<api::Device> =
                        pool.devices.iter().map(wire::device_to_api).collect();
                    plan_pool(
                        ctx,
                        pool_name,
                        pool,
                        &devices,
                        &current,
                        memory.get(pool_name),
                        &mut plan,
                    );
                }
                Err(errors) => {
                    plan.invalid.insert(pool_name.clone(), errors);
                }
            },
        }
    }

    // Pools that are no longer desired.
    for slice in by_pool.into_values().flatten() {
        plan.deletes.push(delete_of(slice));
    }
    plan
}

fn validate_pool(ctx: &PlanContext<'_>, name: &str, pool: &Pool) -> Result<(), ValidationErrors> {
    let mut errors = pool
        .validate_for(name, ctx.limits, Some(ctx.driver))
        .err()
        .unwrap_or_default();
    let scope_problem = match (ctx.node.is_some(), &pool.node_selection) {
        (true, PoolNodeSelection::Local) => None,
        (true, _) => Some(
            "must be PoolNodeSelection::Local: a node-local publisher only publishes its own node's pools (use ResourceSlicePublisher::for_cluster for network-attached pools)",
        ),
        (false, PoolNodeSelection::Local) => Some(
            "must not be PoolNodeSelection::Local: a cluster-wide publisher has no node of its own (use NodeSelector, AllNodes or PerDevice)",
        ),
        (false, _) => None,
    };
    if let Some(problem) = scope_problem {
        errors.errors.push(ValidationError {
            path: FieldPath {
                pool: Some(name.to_owned()),
                device: None,
                field: "nodeSelection".to_owned(),
            },
            problem: Problem::NodeSelection(problem),
        });
    }
    if errors.errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn delete_of(slice: &api::ResourceSlice) -> Delete {
    Delete {
        name: slice.metadata.name.clone().unwrap_or_default(),
        uid: slice.metadata.uid.clone(),
        resource_version: slice.metadata.resource_version.clone(),
    }
}

/// The layout of a pool as read back from its slices of generation `generation`.
fn previous_from_observed(
    ctx: &PlanContext<'_>,
    pool_name: &str,
    current: &[&api::ResourceSlice],
    generation: i64,
) -> Vec<PreviousSlice> {
    let mut previous: Vec<PreviousSlice> = current
        .iter()
        .filter(|s| s.spec.pool.generation == generation)
        .filter_map(|s| {
            let name = s.metadata.name.as_deref()?;
            let index = slice_names::slice_index(name, ctx.node, ctx.driver, pool_name)?;
            Some(PreviousSlice {
                index,
                devices: s
                    .spec
                    .devices
                    .iter()
                    .flatten()
                    .map(|d| d.name.clone())
                    .collect(),
                counter_sets: s
                    .spec
                    .shared_counters
                    .iter()
                    .flatten()
                    .map(|c| c.name.clone())
                    .collect(),
            })
        })
        .collect();
    previous.sort_by_key(|s| s.index);
    previous
}

/// The desired slice for one layout entry, before generation and count are filled in.
fn desired_slice(
    ctx: &PlanContext<'_>,
    pool_name: &str,
    pool: &Pool,
    devices: &[api::Device],
    assignment: &layout::SliceAssignment,
) -> api::ResourceSlice {
    let mut spec = api::ResourceSliceSpec {
        driver: ctx.driver.to_owned(),
        pool: api::ResourcePool {
            name: pool_name.to_owned(),
            generation: 0,
            resource_slice_count: 0,
        },
        ..Default::default()
    };
    match &pool.node_selection {
        PoolNodeSelection::Local => spec.node_name = ctx.node.map(str::to_owned),
        PoolNodeSelection::NodeSelector(selector) => spec.node_selector = Some(selector.clone()),
        PoolNodeSelection::AllNodes => spec.all_nodes = Some(true),
        PoolNodeSelection::PerDevice => spec.per_device_node_selection = Some(true),
    }
    if !assignment.devices.is_empty() {
        spec.devices = Some(
            assignment
                .devices
                .iter()
                .map(|&d| devices[d].clone())
                .collect(),
        );
    }
    if !assignment.counter_sets.is_empty() {
        spec.shared_counters = Some(
            assignment
                .counter_sets
                .iter()
                .map(|&s| wire::counter_set_to_api(&pool.shared_counters[s]))
                .collect(),
        );
    }
    // skipNodeOperations only where the server's release knows it (unknown: try, and learn
    // from a dropped field); partitionTypeAttribute is refused by validation elsewhere.
    wire::set_slice_fields(
        &mut spec,
        pool.partition_type_attribute.as_deref(),
        ctx.skip_node_operations && ctx.limits.device_model_1_37,
    );
    wire::strip_features(&mut spec, ctx.disabled);
    api::ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_names::slice_name(
                ctx.node,
                ctx.driver,
                pool_name,
                assignment.index,
            )),
            owner_references: ctx.owner.map(|owner| vec![owner.clone()]),
            ..Default::default()
        },
        spec,
    }
}

/// Whether an observed slice can be updated into the desired one (immutable fields agree).
fn updatable(desired: &api::ResourceSliceSpec, observed: &api::ResourceSliceSpec) -> bool {
    desired.driver == observed.driver
        && desired.node_name == observed.node_name
        && desired.pool.name == observed.pool.name
}

fn owner_present(ctx: &PlanContext<'_>, observed: &ObjectMeta) -> bool {
    ctx.owner.is_none_or(|owner| {
        observed
            .owner_references
            .iter()
            .flatten()
            .any(|o| o == owner)
    })
}

/// Metadata for replacing `observed`: its labels, annotations and foreign owners stay, ours
/// is added, and the resource version guards against lost updates.
fn update_metadata(ctx: &PlanContext<'_>, observed: &ObjectMeta) -> ObjectMeta {
    let mut metadata = observed.clone();
    metadata.managed_fields = None;
    if let Some(owner) = ctx.owner {
        let mut owners: Vec<OwnerReference> = observed
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.uid != owner.uid)
            .cloned()
            .collect();
        owners.push(owner.clone());
        metadata.owner_references = Some(owners);
    }
    metadata
}

enum State<'a> {
    Missing,
    /// Present with the right content at the pool's current generation.
    Unchanged(&'a api::ResourceSlice),
    /// Present at the current generation, content differs.
    Changed(&'a api::ResourceSlice),
    /// Present at an older generation (invisible to consumers).
    Stale(&'a api::ResourceSlice),
    /// Present, but immutable fields differ: delete and recreate.
    Replace(&'a api::ResourceSlice),
}

fn plan_pool(
    ctx: &PlanContext<'_>,
    pool_name: &str,
    pool: &Pool,
    devices: &[api::Device],
    current: &[&api::ResourceSlice],
    memory: Option<&Vec<PreviousSlice>>,
    plan: &mut Plan,
) {
    let current_generation = current.iter().map(|s| s.spec.pool.generation).max();
    let derived;
    let previous = match (memory, current_generation) {
        (Some(memory), _) => Some(memory.as_slice()),
        (None, Some(generation)) => {
            derived = previous_from_observed(ctx, pool_name, current, generation);
            Some(derived.as_slice())
        }
        (None, None) => None,
    };
    let assignments = layout::assign(pool, ctx.limits, previous);
    let count = i64::try_from(assignments.len()).unwrap_or(i64::MAX);
    let mut desired: Vec<api::ResourceSlice> = assignments
        .iter()
        .map(|a| desired_slice(ctx, pool_name, pool, devices, a))
        .collect();
    plan.layouts.insert(
        pool_name.to_owned(),
        assignments
            .iter()
            .map(|a| PreviousSlice::from_assignment(pool, a))
            .collect(),
    );

    let observed: BTreeMap<&str, &api::ResourceSlice> = current
        .iter()
        .filter_map(|s| Some((s.metadata.name.as_deref()?, *s)))
        .collect();
    let desired_names: BTreeSet<String> = desired
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();

    // Classify against the current generation.
    let generation_now = current_generation.unwrap_or(0);
    let mut states = Vec::with_capacity(desired.len());
    let mut visible_changes = 0usize;
    for slice in &mut desired {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        let state = match observed.get(name) {
            None => State::Missing,
            Some(&obs) if !updatable(&slice.spec, &obs.spec) => {
                if obs.spec.pool.generation == generation_now {
                    visible_changes += 1;
                }
                State::Replace(obs)
            }
            Some(&obs) => {
                wire::inherit_taint_times(&mut slice.spec, &obs.spec);
                slice.spec.pool.generation = generation_now;
                slice.spec.pool.resource_slice_count = count;
                if obs.spec.pool.generation != generation_now {
                    State::Stale(obs)
                } else if wire::specs_equal(&slice.spec, &obs.spec) {
                    State::Unchanged(obs)
                } else {
                    visible_changes += 1;
                    State::Changed(obs)
                }
            }
        };
        states.push(state);
    }
    let extra: Vec<&api::ResourceSlice> = current
        .iter()
        .filter(|s| {
            s.metadata
                .name
                .as_ref()
                .is_none_or(|n| !desired_names.contains(n))
        })
        .copied()
        .collect();
    visible_changes += extra
        .iter()
        .filter(|s| s.spec.pool.generation == generation_now)
        .count();
    let count_changed = current.iter().any(|s| {
        s.spec.pool.generation == generation_now && s.spec.pool.resource_slice_count != count
    });

    let keep = current_generation.is_some()
        && !count_changed
        && visible_changes <= 1
        && pool.generation.is_none_or(|g| g <= generation_now);
    let generation = match current_generation {
        _ if keep => generation_now,
        Some(g) => g.saturating_add(1).max(pool.generation.unwrap_or(0)),
        None => pool.generation.unwrap_or(0),
    };

    plan.deletes.extend(extra.iter().map(|s| delete_of(s)));
    for (mut slice, state) in desired.into_iter().zip(states) {
        slice.spec.pool.generation = generation;
        slice.spec.pool.resource_slice_count = count;
        match state {
            State::Missing => plan.creates.push(slice),
            State::Replace(obs) => {
                plan.deletes.push(delete_of(obs));
                plan.creates.push(slice);
            }
            State::Unchanged(obs) if generation == generation_now => {
                if !owner_present(ctx, &obs.metadata) {
                    slice.metadata = update_metadata(ctx, &obs.metadata);
                    plan.updates.push(slice);
                }
            }
            State::Unchanged(obs) | State::Changed(obs) | State::Stale(obs) => {
                slice.metadata = update_metadata(ctx, &obs.metadata);
                plan.updates.push(slice);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::limits::KubernetesVersion;
    use crate::slices::model::{CounterSet, Device, DeviceTaint, NodeSelector, TaintEffect};
    use k8s_openapi::api::core::v1::NodeSelectorTerm;

    struct Fixture {
        limits: SliceLimits,
        owner: OwnerReference,
        disabled: BTreeSet<FeatureGate>,
        observed: BTreeMap<String, api::ResourceSlice>,
        memory: BTreeMap<String, Vec<PreviousSlice>>,
        next_rv: u64,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                limits: SliceLimits::for_release(KubernetesVersion::new(1, 36)),
                owner: OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: "node-1".into(),
                    uid: "uid-1".into(),
                    controller: Some(true),
                    ..Default::default()
                },
                disabled: BTreeSet::new(),
                observed: BTreeMap::new(),
                memory: BTreeMap::new(),
                next_rv: 1,
            }
        }

        fn plan(&self, desired: &DriverResources) -> Plan {
            let ctx = PlanContext {
                driver: "gpu.example.com",
                node: Some("node-1"),
                owner: Some(&self.owner),
                limits: &self.limits,
                disabled: &self.disabled,
                skip_node_operations: false,
            };
            plan(&ctx, desired, &self.observed, &self.memory)
        }

        /// Plans and applies the writes like a perfect server; returns the plan.
        fn sync(&mut self, desired: &DriverResources) -> Plan {
            let plan = self.plan(desired);
            for delete in &plan.deletes {
                self.observed.remove(&delete.name);
            }
            for slice in plan.updates.iter().chain(&plan.creates) {
                let mut stored = slice.clone();
                stored.metadata.resource_version = Some(self.next_rv.to_string());
                stored
                    .metadata
                    .uid
                    .get_or_insert_with(|| format!("u{}", self.next_rv));
                self.next_rv += 1;
                self.observed
                    .insert(stored.metadata.name.clone().unwrap(), stored);
            }
            self.memory = plan.layouts.clone();
            plan
        }

        fn generations(&self) -> BTreeSet<i64> {
            self.observed
                .values()
                .map(|s| s.spec.pool.generation)
                .collect()
        }
    }

    fn gpus(n: usize) -> Vec<Device> {
        (0..n)
            .map(|i| Device::new(format!("gpu-{i}")).attribute("index", i as i64))
            .collect()
    }

    #[test]
    fn first_publish_then_noop() {
        let mut f = Fixture::new();
        let desired = DriverResources::single_pool("node-1", gpus(100));
        let first = f.sync(&desired);
        assert_eq!(
            (
                first.creates.len(),
                first.updates.len(),
                first.deletes.len()
            ),
            (2, 0, 0)
        );
        let slice = &first.creates[0];
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(slice.spec.pool.resource_slice_count, 2);
        assert_eq!(slice.spec.pool.generation, 0);
        assert_eq!(
            slice.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
        assert!(f.plan(&desired).is_empty());

        // Also a no-op after a restart (no memory).
        f.memory.clear();
        assert!(f.plan(&desired).is_empty());
    }

    #[test]
    fn one_device_change_rewrites_one_slice_at_the_same_generation() {
        let mut f = Fixture::new();
        let mut devices = gpus(300);
        f.sync(&DriverResources::single_pool("node-1", devices.clone()));
        devices[200] = devices[200]
            .clone()
            .taint(DeviceTaint::new("example.com/xid", TaintEffect::NoExecute));
        let plan = f.sync(&DriverResources::single_pool("node-1", devices.clone()));
        assert_eq!(
            (plan.creates.len(), plan.updates.len(), plan.deletes.len()),
            (0, 1, 0)
        );
        assert_eq!(plan.updates[0].spec.pool.generation, 0);
        assert!(plan.updates[0].metadata.resource_version.is_some());
        // Taint removed again.
        devices[200].taints.clear();
        let plan = f.sync(&DriverResources::single_pool("node-1", devices));
        assert_eq!(plan.len(), 1);
        assert_eq!(f.generations(), BTreeSet::from([0]));
    }

    #[test]
    fn two_slice_changes_bump_the_generation_everywhere() {
        let mut f = Fixture::new();
        let mut devices = gpus(200);
        f.sync(&DriverResources::single_pool("node-1", devices.clone()));
        devices[0] = devices[0].clone().attribute("x", 1);
        devices[199] = devices[199].clone().attribute("x", 1);
        let plan = f.sync(&DriverResources::single_pool("node-1", devices));
        assert_eq!(plan.updates.len(), 4);
        assert_eq!(f.generations(), BTreeSet::from([1]));
    }

    #[test]
    fn growing_the_slice_count_bumps_the_generation() {
        let mut f = Fixture::new();
        f.sync(&DriverResources::single_pool("node-1", gpus(64)));
        let plan = f.sync(&DriverResources::single_pool("node-1", gpus(65)));
        assert_eq!((plan.creates.len(), plan.updates.len()), (1, 1));
        assert_eq!(f.generations(), BTreeSet::from([1]));
        assert!(
            f.observed
                .values()
                .all(|s| s.spec.pool.resource_slice_count == 2)
        );
    }

    #[test]
    fn explicit_generation_wins() {
        let mut f = Fixture::new();
        let pool = Pool::new(gpus(3)).generation(7);
        f.sync(&DriverResources::new().with_pool("node-1", pool.clone()));
        assert_eq!(f.generations(), BTreeSet::from([7]));
        assert!(
            f.plan(&DriverResources::new().with_pool("node-1", pool))
                .is_empty()
        );
    }

    #[test]
    fn external_delete_and_edit_are_repaired_without_a_generation_bump() {
        let mut f = Fixture::new();
        let desired = DriverResources::single_pool("node-1", gpus(200));
        f.sync(&desired);
        let names: Vec<String> = f.observed.keys().cloned().collect();
        f.observed.remove(&names[1]);
        let plan = f.sync(&desired);
        assert_eq!((plan.creates.len(), plan.updates.len()), (1, 0));
        assert_eq!(f.generations(), BTreeSet::from([0]));

        let edited = f.observed.get_mut(&names[2]).unwrap();
        edited.spec.devices.as_mut().unwrap().pop();
        let plan = f.sync(&desired);
        assert_eq!((plan.creates.len(), plan.updates.len()), (0, 1));
        assert_eq!(f.generations(), BTreeSet::from([0]));

        // Losing our owner reference is repaired with a metadata-only update.
        f.observed
            .get_mut(&names[0])
            .unwrap()
            .metadata
            .owner_references = None;
        let plan = f.sync(&desired);
        assert_eq!(plan.updates.len(), 1);
        assert!(f.plan(&desired).is_empty());
    }

    #[test]
    fn wiped_pool_is_recreated_with_the_same_names() {
        let mut f = Fixture::new();
        let desired = DriverResources::single_pool("node-1", gpus(100));
        f.sync(&desired);
        let before: BTreeSet<String> = f.observed.keys().cloned().collect();
        f.observed.clear();
        let plan = f.sync(&desired);
        assert_eq!(plan.creates.len(), 2);
        assert_eq!(f.observed.keys().cloned().collect::<BTreeSet<_>>(), before);
    }

    #[test]
    fn removed_pools_and_foreign_slices_are_deleted() {
        let mut f = Fixture::new();
        f.sync(
            &DriverResources::single_pool("node-1", gpus(2))
                .with_pool("node-1-extra", Pool::new(gpus(1))),
        );
        let mut stray = f.observed.values().next().unwrap().clone();
        stray.metadata.name = Some("node-1-gpu.example.com-abcde".into());
        f.observed
            .insert("node-1-gpu.example.com-abcde".into(), stray);
        let plan = f.sync(&DriverResources::single_pool("node-1", gpus(2)));
        assert_eq!(plan.deletes.len(), 2);
        assert_eq!(
            plan.deletes[0].resource_version.as_deref().map(|_| ()),
            Some(())
        );
        assert_eq!(f.observed.len(), 1);
        // Nothing desired: everything goes.
        let plan = f.sync(&DriverResources::new());
        assert_eq!(plan.deletes.len(), 1);
        assert!(f.observed.is_empty());
    }

    #[test]
    fn invalid_pools_are_reported_and_left_alone() {
        let mut f = Fixture::new();
        f.sync(&DriverResources::single_pool("node-1", gpus(2)));
        let bad = DriverResources::single_pool("node-1", vec![Device::new("Bad")]);
        let plan = f.plan(&bad);
        assert!(plan.is_empty());
        assert!(
            plan.invalid["node-1"]
                .to_string()
                .contains("device \"Bad\"")
        );

        let network = DriverResources::new().with_pool(
            "net",
            Pool::new(gpus(1)).node_selection(PoolNodeSelection::NodeSelector(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm::default()],
            })),
        );
        let plan = f.plan(&network);
        assert!(plan.invalid["net"].to_string().contains("for_cluster"));
    }

    #[test]
    fn cluster_scope_publishes_node_selection() {
        let limits = SliceLimits::strictest();
        let disabled = BTreeSet::new();
        let ctx = PlanContext {
            driver: "net.example.com",
            node: None,
            owner: None,
            limits: &limits,
            disabled: &disabled,
            skip_node_operations: false,
        };
        let desired = DriverResources::new()
            .with_pool(
                "rack-1",
                Pool::new(gpus(1)).node_selection(PoolNodeSelection::AllNodes),
            )
            .with_pool("rack-2", Pool::new(gpus(1)));
        let plan = plan(&ctx, &desired, &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(plan.creates.len(), 1);
        assert_eq!(plan.creates[0].spec.all_nodes, Some(true));
        assert_eq!(plan.creates[0].spec.node_name, None);
        assert!(plan.creates[0].metadata.owner_references.is_none());
        assert!(plan.invalid.contains_key("rack-2"));
    }

    #[test]
    fn disabled_features_are_not_rewritten_forever() {
        let mut f = Fixture::new();
        let devices: Vec<Device> = gpus(2)
            .into_iter()
            .map(|d| d.taint(DeviceTaint::new("example.com/t", TaintEffect::NoSchedule)))
            .collect();
        let desired = DriverResources::single_pool("node-1", devices);
        f.sync(&desired);
        // The server dropped the taints.
        for slice in f.observed.values_mut() {
            for device in slice.spec.devices.iter_mut().flatten() {
                device.taints = None;
            }
        }
        assert!(!f.plan(&desired).is_empty());
        f.disabled.insert(FeatureGate::DeviceTaints);
        assert!(f.plan(&desired).is_empty());
    }

    #[test]
    fn partitionable_pool_on_1_35() {
        let mut f = Fixture::new();
        f.limits = SliceLimits::for_release(KubernetesVersion::new(1, 35));
        let mut pool = Pool::new([]);
        for gpu in 0..2 {
            pool = pool
                .counter_set(CounterSet::new(format!("gpu-{gpu}"), [("memory", "80Gi")]))
                .device(
                    Device::new(format!("gpu-{gpu}"))
                        .consumes(format!("gpu-{gpu}"), [("memory", "80Gi")]),
                )
                .device(
                    Device::new(format!("gpu-{gpu}-half"))
                        .consumes(format!("gpu-{gpu}"), [("memory", "40Gi")]),
                );
        }
        let plan = f.sync(&DriverResources::new().with_pool("node-1", pool.clone()));
        assert_eq!(plan.creates.len(), 2);
        assert!(plan.creates[0].spec.devices.is_none());
        assert_eq!(
            plan.creates[0].spec.shared_counters.as_ref().unwrap().len(),
            2
        );
        assert_eq!(plan.creates[1].spec.devices.as_ref().unwrap().len(), 4);
        assert!(
            f.plan(&DriverResources::new().with_pool("node-1", pool))
                .is_empty()
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn consistent(f: &Fixture, devices: &[Device]) -> Result<(), TestCaseError> {
            let slices: Vec<&api::ResourceSlice> = f.observed.values().collect();
            let generations: BTreeSet<i64> =
                slices.iter().map(|s| s.spec.pool.generation).collect();
            prop_assert_eq!(generations.len(), 1);
            for slice in &slices {
                prop_assert_eq!(slice.spec.pool.resource_slice_count, slices.len() as i64);
            }
            let published: Vec<&str> = slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.as_str()))
                .collect();
            let unique: BTreeSet<&str> = published.iter().copied().collect();
            prop_assert_eq!(unique.len(), published.len());
            let expected: BTreeSet<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            prop_assert_eq!(unique, expected);
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]

            /// Any sequence of driver changes and external deletions converges to a consistent
            /// pool, after which planning again writes nothing; changing one device's attribute
            /// is one write.
            #[test]
            fn converges_and_stays_quiet(
                initial in 0usize..300,
                steps in proptest::collection::vec((0u8..5, any::<usize>()), 1..15),
            ) {
                let mut f = Fixture::new();
                let mut devices = gpus(initial);
                let mut next = initial;
                f.sync(&DriverResources::single_pool("node-1", devices.clone()));
                for (op, at) in steps {
                    let len = devices.len();
                    let mut single_change = false;
                    match op {
                        0 if len > 0 => { devices.remove(at % len); }
                        1 => {
                            devices.insert(at % (len + 1), Device::new(format!("new-{next}")));
                            next += 1;
                        }
                        2 if len > 0 => {
                            let d = &mut devices[at % len];
                            *d = d.clone().attribute("serial", at as i64);
                            single_change = true;
                        }
                        3 if !f.observed.is_empty() => {
                            let names: Vec<String> = f.observed.keys().cloned().collect();
                            f.observed.remove(&names[at % names.len()]);
                        }
                        _ => {}
                    }
                    let desired = DriverResources::single_pool("node-1", devices.clone());
                    let plan = f.sync(&desired);
                    if single_change {
                        prop_assert!(plan.len() <= 1, "one device change took {} writes", plan.len());
                    }
                    consistent(&f, &devices)?;
                    prop_assert!(f.plan(&desired).is_empty());
                }
            }
        }
    }
}

//! The allocator's verdict on every device for every request of a claim, and the holders of a
//! node's devices: the checks of the search, made one device at a time and kept with their
//! details instead of a yes or no.

use std::collections::{BTreeMap, HashMap};

use super::super::explain::{
    CapacityUsage, CelStage, CounterHolder, CounterSetUsage, CounterUsage, DeviceExplanation,
    Holder, NodeDevice, NodeDevices, NodeMismatch, RequestExplanation, SelectorOwner, SelectorRef,
    Verdict,
};
use super::super::index::HeldDevice;
use super::*;

/// `(driver, pool, device)`.
type DeviceKey = (String, String, String);

/// Holders of devices, from the allocator's claims other than `claim` (all with `None`).
fn holders_by_device(
    allocator: &Allocator,
    claim: Option<&model::Claim>,
    admin: bool,
) -> HashMap<DeviceKey, Vec<Holder>> {
    let mut holders: HashMap<DeviceKey, Vec<Holder>> = HashMap::new();
    for held in &allocator.held {
        if claim.is_some_and(|claim| held.is_same_claim(claim)) {
            continue;
        }
        let name = held.display_name();
        let admin_devices = if admin { &held.admin_devices[..] } else { &[] };
        let devices = held
            .devices
            .iter()
            .map(|device| (device, false))
            .chain(admin_devices.iter().map(|device| (device, true)));
        for (device, admin_access) in devices {
            holders.entry(key_of(device)).or_default().push(Holder {
                claim: name.clone(),
                request: device.request.clone(),
                share_id: device.share_id.clone(),
                consumed_capacity: device
                    .share
                    .iter()
                    .flatten()
                    .map(|(name, amount)| (name.clone(), amount.to_string()))
                    .collect(),
                admin_access,
            });
        }
    }
    holders
}

fn key_of(device: &HeldDevice) -> DeviceKey {
    (
        device.driver.clone(),
        device.pool.clone(),
        device.device.clone(),
    )
}

fn device_key(pool: &PoolData, device: &DeviceData) -> DeviceKey {
    (
        pool.driver.clone(),
        pool.name.clone(),
        device.raw.name.clone(),
    )
}

/// The allocated devices of a pool that consume from a counter set (admin access consumes
/// nothing).
fn counter_holders(
    pool: &PoolData,
    set: &str,
    holders: &HashMap<DeviceKey, Vec<Holder>>,
) -> Vec<CounterHolder> {
    let mut result = Vec::new();
    for device in pool.slices.iter().flat_map(|slice| &slice.devices) {
        let Some(claims) = holders.get(&device_key(pool, device)) else {
            continue;
        };
        let claims: Vec<String> = claims
            .iter()
            .filter(|holder| !holder.admin_access)
            .map(|holder| holder.claim.clone())
            .collect();
        if claims.is_empty() {
            continue;
        }
        for (consumed_set, counters) in &device.counters {
            if consumed_set == set {
                result.push(CounterHolder {
                    device: device.raw.name.clone(),
                    claims: claims.clone(),
                    counters: counters
                        .iter()
                        .map(|(name, amount)| (name.clone(), amount.to_string()))
                        .collect(),
                });
            }
        }
    }
    result
}

fn node_mismatch(slice: &SliceData, device: &model::Device) -> NodeMismatch {
    let (node_name, selector) = if slice.per_device {
        (device.node_name.as_ref(), device.node_selector.as_ref())
    } else {
        (slice.node_name.as_ref(), slice.node_selector.as_ref())
    };
    match (node_name, selector) {
        (Some(node), _) => NodeMismatch::OtherNode { node: node.clone() },
        (None, Some(_)) => NodeMismatch::NodeSelector,
        (None, None) => NodeMismatch::NoNodeSelection,
    }
}

/// What a request names, for requests whose alternatives could not be built.
fn unbuilt_request(request: &model::Request, error: &AllocationError) -> Vec<RequestExplanation> {
    let entry = |name: String, class: &str, mode: Option<&str>, count: Option<i64>, admin: bool| {
        let mode = mode.unwrap_or("ExactCount").to_owned();
        RequestExplanation {
            request: name,
            device_class: class.to_owned(),
            count: (mode == "ExactCount").then(|| count.unwrap_or(1)),
            allocation_mode: mode,
            admin_access: admin,
            error: Some(error.to_string()),
            devices: Vec::new(),
        }
    };
    match (&request.exactly, request.first_available.as_slice()) {
        (Some(exact), []) => vec![entry(
            request.name.clone(),
            &exact.device_class_name,
            exact.allocation_mode.as_deref(),
            exact.count,
            exact.admin_access.unwrap_or(false),
        )],
        (None, subrequests) if !subrequests.is_empty() => subrequests
            .iter()
            .map(|sub| {
                entry(
                    format!("{}/{}", request.name, sub.name),
                    &sub.device_class_name,
                    sub.allocation_mode.as_deref(),
                    sub.count,
                    false,
                )
            })
            .collect(),
        _ => vec![entry(request.name.clone(), "", None, None, false)],
    }
}

/// Per request (and subrequest), every device of the cluster with the allocator's verdict for
/// the claim on the node.
pub(crate) fn explain_requests(
    allocator: &Allocator,
    claim: &model::Claim,
    node_name: &str,
) -> Vec<RequestExplanation> {
    let claim_name = claim.display_name();
    let no_labels = BTreeMap::new();
    let node = NodeView {
        name: node_name,
        labels: allocator.node_labels.get(node_name).unwrap_or(&no_labels),
    };
    let (candidates, pools_on_node) = candidates_for(allocator, node);
    let by_position: HashMap<(usize, usize, usize), usize> = candidates
        .iter()
        .enumerate()
        .map(|(index, c)| ((c.pool, c.slice, c.device), index))
        .collect();

    enum Entry {
        Slot(usize),
        Unbuilt(Vec<RequestExplanation>),
    }
    let mut entries = Vec::new();
    let mut slots = Vec::new();
    for request in &claim.spec.devices.requests {
        match build_slot(allocator, &claim_name, request) {
            Ok(slot) => {
                entries.push(Entry::Slot(slots.len()));
                slots.push(slot);
            }
            Err(error) => entries.push(Entry::Unbuilt(unbuilt_request(request, &error))),
        }
    }
    // Well-formed constraints, with their position in the claim.
    let constraints: Vec<(usize, ConstraintState)> = claim
        .spec
        .devices
        .constraints
        .iter()
        .enumerate()
        .filter_map(|(index, constraint)| {
            let (kind, attribute) = constraint.kind()?;
            let attribute = attribute.clone();
            let state = ConstraintState {
                requests: constraint.requests.clone(),
                attribute,
                kind,
                values: Vec::new(),
            };
            Some((index, state))
        })
        .collect();

    let (cel_env, cel_error) = match &allocator.cel {
        Ok(env) => (Some(env), None),
        Err(error) => (None, Some(error.as_str())),
    };
    let selection = Selection {
        env: cel_env,
        env_error: cel_error,
        tolerate_missing_attributes: allocator.tolerate_missing_attributes,
        claim_name: &claim_name,
        programs: HashMap::new(),
        contexts: HashMap::new(),
        matches: HashMap::new(),
        derived: HashMap::new(),
    };
    let problem = Problem {
        allocator,
        claim,
        claim_name: claim_name.clone(),
        node,
        candidates,
        pools_on_node,
        slots,
    };
    let state = initial_state(&problem, Vec::new());
    let mut search = Search {
        problem: &problem,
        selection,
        state,
    };
    let holders = holders_by_device(allocator, Some(claim), false);

    let mut explained = Vec::new();
    for entry in entries {
        let slot_index = match entry {
            Entry::Unbuilt(requests) => {
                explained.extend(requests);
                continue;
            }
            Entry::Slot(index) => index,
        };
        let slot = &problem.slots[slot_index];
        for (alt_index, wanted) in slot.alternatives.iter().enumerate() {
            let mut devices = Vec::new();
            for (pool_index, pool) in allocator.pools.iter().enumerate() {
                for (slice_index, slice) in pool.slices.iter().enumerate() {
                    for (device_index, device) in slice.devices.iter().enumerate() {
                        let verdict =
                            match by_position.get(&(pool_index, slice_index, device_index)) {
                                None => Verdict::NodeNotEligible {
                                    reason: node_mismatch(slice, &device.raw),
                                },
                                Some(&candidate) => search.verdict(
                                    slot_index,
                                    alt_index,
                                    candidate,
                                    &holders,
                                    &constraints,
                                ),
                            };
                        devices.push(DeviceExplanation {
                            driver: pool.driver.clone(),
                            pool: pool.name.clone(),
                            device: device.raw.name.clone(),
                            verdict,
                        });
                    }
                }
            }
            explained.push(RequestExplanation {
                request: wanted.name.clone(),
                device_class: wanted.class.metadata.name().to_owned(),
                allocation_mode: if wanted.all { "All" } else { "ExactCount" }.to_owned(),
                count: (!wanted.all).then(|| i64::try_from(wanted.count).unwrap_or(i64::MAX)),
                admin_access: wanted.admin,
                error: None,
                devices,
            });
        }
    }
    explained
}

fn selector_verdict(miss: SelectorMiss<'_>, owner: SelectorOwner) -> Verdict {
    let selector = |index: usize, expression: &str| SelectorRef {
        owner: owner.clone(),
        index,
        expression: expression.to_owned(),
    };
    match miss {
        SelectorMiss::False { index, expression } => match &owner {
            SelectorOwner::Class(class) => Verdict::ClassSelectorFalse {
                class: class.clone(),
                index,
                expression: expression.to_owned(),
            },
            SelectorOwner::Request(request) => Verdict::RequestSelectorFalse {
                request: request.clone(),
                index,
                expression: expression.to_owned(),
            },
        },
        SelectorMiss::Compile {
            index,
            expression,
            message,
        } => Verdict::CelError {
            selector: selector(index, expression),
            stage: CelStage::Compile,
            message,
        },
        SelectorMiss::Runtime {
            index,
            expression,
            message,
        } => match message.strip_prefix("no such key: ") {
            Some(name) => Verdict::MissingAttribute {
                selector: selector(index, expression),
                name: name.trim().to_owned(),
                message,
            },
            None => Verdict::CelError {
                selector: selector(index, expression),
                stage: CelStage::Runtime,
                message,
            },
        },
    }
}

impl Search<'_> {
    /// The verdict on one device of the node for one alternative, in the order the search
    /// checks: pool, class selectors, request selectors, availability, constraints.
    fn verdict(
        &mut self,
        slot: usize,
        alternative: usize,
        candidate: usize,
        holders: &HashMap<DeviceKey, Vec<Holder>>,
        constraints: &[(usize, ConstraintState)],
    ) -> Verdict {
        let problem = self.problem;
        let pool = problem.pool(candidate);
        if pool.incomplete {
            return Verdict::PoolUnusable {
                pool: pool.id(),
                reason: "being updated (it has fewer slices of its newest generation than resourceSliceCount)".to_owned(),
            };
        }
        if let Some(reason) = &pool.invalid {
            return Verdict::PoolUnusable {
                pool: pool.id(),
                reason: format!("invalid: {reason}"),
            };
        }
        let wanted = &problem.slots[slot].alternatives[alternative];
        let device = problem.device(candidate);
        let driver = pool.driver.as_str();
        let lists = [
            (
                &wanted.class.spec.selectors[..],
                SelectorOwner::Class(wanted.class.metadata.name().to_owned()),
            ),
            (
                wanted.selectors,
                SelectorOwner::Request(wanted.name.clone()),
            ),
        ];
        for (selectors, owner) in lists {
            match self
                .selection
                .check_selectors(selectors, candidate, driver, device)
            {
                Ok(None) => {}
                Ok(Some(miss)) => return selector_verdict(miss, owner),
                Err(error) => {
                    let expression = selectors
                        .iter()
                        .find_map(|s| s.cel.as_ref())
                        .map(|cel| cel.expression.clone())
                        .unwrap_or_default();
                    return Verdict::CelError {
                        selector: SelectorRef {
                            owner,
                            index: 0,
                            expression,
                        },
                        stage: CelStage::Compile,
                        message: error.to_string(),
                    };
                }
            }
        }
        let key = device_key(pool, device);
        let holders_of = |key: &DeviceKey| holders.get(key).cloned().unwrap_or_default();
        match self.availability_detail(wanted, candidate) {
            Ok(_) => {}
            Err(Unavailable::Allocated) => {
                return Verdict::Allocated {
                    holders: holders_of(&key),
                };
            }
            Err(Unavailable::Tainted(taint)) => {
                let taint = *taint;
                return Verdict::Tainted {
                    key: taint.key,
                    value: taint.value.filter(|value| !value.is_empty()),
                    effect: taint.effect,
                };
            }
            Err(Unavailable::Capacity(shortfall)) => {
                return match *shortfall {
                    CapacityShortfall::Missing { capacity } => {
                        Verdict::CapacityMissing { capacity }
                    }
                    CapacityShortfall::TooSmall {
                        capacity,
                        requested,
                        available,
                    } => Verdict::CapacityTooSmall {
                        capacity,
                        requested: requested.to_string(),
                        available: available.to_string(),
                    },
                    CapacityShortfall::Policy {
                        capacity,
                        amount,
                        reason,
                    } => Verdict::CapacityPolicy {
                        capacity,
                        amount: amount.to_string(),
                        reason,
                    },
                    CapacityShortfall::Exhausted {
                        capacity,
                        needed,
                        used,
                        total,
                    } => Verdict::CapacityExhausted {
                        capacity,
                        needed: needed.to_string(),
                        used: used.to_string(),
                        total: total.to_string(),
                        holders: holders_of(&key)
                            .into_iter()
                            .filter(|holder| holder.share_id.is_some())
                            .collect(),
                    },
                };
            }
            Err(Unavailable::Counters(shortfall)) => {
                let shortfall = *shortfall;
                let total = pool
                    .counter_sets
                    .get(&shortfall.set)
                    .and_then(|set| set.get(&shortfall.counter))
                    .copied()
                    .unwrap_or(Quantity::ZERO);
                return Verdict::CountersExhausted {
                    holders: counter_holders(pool, &shortfall.set, holders),
                    counter_set: shortfall.set,
                    counter: shortfall.counter,
                    needed: shortfall.needed.to_string(),
                    left: shortfall.left.to_string(),
                    total: total.to_string(),
                };
            }
            Err(Unavailable::Groups(conflict)) => {
                let conflict = *conflict;
                let (allocated_groups, allocated_without_groups) = match conflict.placed {
                    Intersection::Groups(common) => (common.into_iter().collect(), false),
                    Intersection::NoGroups => (Vec::new(), true),
                    Intersection::Unplaced => (Vec::new(), false),
                };
                return Verdict::CompatibilityGroupConflict {
                    holders: counter_holders(pool, &conflict.set, holders),
                    counter_set: conflict.set,
                    groups: conflict.groups.into_iter().collect(),
                    allocated_groups,
                    allocated_without_groups,
                };
            }
        }
        for (index, constraint) in constraints {
            // A derived attribute of the request stands in for the device's attribute.
            if constraint.applies(wanted.base, &wanted.name)
                && !wanted
                    .derived
                    .iter()
                    .any(|d| d.name == constraint.attribute)
                && !device.attributes.contains_key(&constraint.attribute)
            {
                return Verdict::ConstraintAttributeMissing {
                    constraint: *index,
                    attribute: constraint.attribute.clone(),
                };
            }
        }
        Verdict::Available
    }
}

/// The node's devices, who holds them, and what is left of their pools' counter sets.
pub(crate) fn node_devices(allocator: &Allocator, node_name: &str) -> NodeDevices {
    let no_labels = BTreeMap::new();
    let node = NodeView {
        name: node_name,
        labels: allocator.node_labels.get(node_name).unwrap_or(&no_labels),
    };
    let (candidates, pools_on_node) = candidates_for(allocator, node);
    let holders = holders_by_device(allocator, None, true);
    let mut devices = Vec::with_capacity(candidates.len());
    for candidate in &candidates {
        let pool = &allocator.pools[candidate.pool];
        let device = &pool.slices[candidate.slice].devices[candidate.device];
        let device_holders = holders
            .get(&device_key(pool, device))
            .cloned()
            .unwrap_or_default();
        let capacity = device
            .capacity
            .iter()
            .map(|(name, data)| {
                let used = device_holders
                    .iter()
                    .filter(|holder| !holder.admin_access)
                    .filter_map(|holder| holder.consumed_capacity.get(name))
                    .filter_map(|amount| Quantity::parse(amount).ok())
                    .fold(Quantity::ZERO, |sum, amount| {
                        sum.checked_add(amount).unwrap_or(sum)
                    });
                CapacityUsage {
                    name: name.clone(),
                    total: data.value.to_string(),
                    used: used.to_string(),
                }
            })
            .collect();
        let pool_problem = match (&pool.invalid, pool.incomplete) {
            (Some(reason), _) => Some(format!("invalid: {reason}")),
            (None, true) => Some("being updated".to_owned()),
            (None, false) => None,
        };
        devices.push(NodeDevice {
            driver: pool.driver.clone(),
            pool: pool.name.clone(),
            device: device.raw.name.clone(),
            allow_multiple_allocations: device.multi,
            pool_problem,
            holders: device_holders,
            capacity,
            consumes_counters: device
                .counters
                .iter()
                .map(|(set, counters)| {
                    let counters = counters
                        .iter()
                        .map(|(name, amount)| (name.clone(), amount.to_string()))
                        .collect();
                    (set.clone(), counters)
                })
                .collect(),
            taints: device
                .raw
                .taints
                .iter()
                .map(|taint| match taint.value.as_deref() {
                    Some(value) if !value.is_empty() => {
                        format!("{}={value}:{}", taint.key, taint.effect)
                    }
                    _ => format!("{}:{}", taint.key, taint.effect),
                })
                .collect(),
        });
    }

    // What is left of the counter sets: the search's starting state, for no claim.
    let problem = Problem {
        allocator,
        claim: &model::Claim::default(),
        claim_name: String::new(),
        node,
        candidates,
        pools_on_node,
        slots: Vec::new(),
    };
    let state = initial_state(&problem, Vec::new());
    let mut counter_sets = Vec::new();
    for &pool_index in &problem.pools_on_node {
        let pool = &allocator.pools[pool_index];
        let left = state.counters_left.get(&pool_index);
        for (set, counters) in &pool.counter_sets {
            counter_sets.push(CounterSetUsage {
                driver: pool.driver.clone(),
                pool: pool.name.clone(),
                counter_set: set.clone(),
                counters: counters
                    .iter()
                    .map(|(name, total)| CounterUsage {
                        counter: name.clone(),
                        total: total.to_string(),
                        left: left
                            .and_then(|left| left.get(set))
                            .and_then(|set| set.get(name))
                            .copied()
                            .unwrap_or(*total)
                            .to_string(),
                    })
                    .collect(),
                holders: counter_holders(pool, set, &holders),
            });
        }
    }
    NodeDevices {
        node: node_name.to_owned(),
        devices,
        counter_sets,
    }
}

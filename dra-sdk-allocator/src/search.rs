//! One allocation: candidate devices for the node, the backtracking search over requests, and the
//! allocation result in the scheduler's shape.

use std::collections::{BTreeMap, HashMap, HashSet};

use cel::{Context, Program};
use serde_json::{Map, Value, json};
use tracing::{debug, trace};

use super::cel::{CelEnvironment, derived_value, device_matches};
use super::index::{AttributeValue, CapacityData, DeviceData, PoolData, SliceData};
use super::model::{self, ConstraintKind, NodeSelectorRequirement};
use super::nodes::{NodeView, selector_matches};
use super::{AllocationError, Allocator, RequestProblem, UnsatisfiableReason};
use dra_sdk::k8s::QuantityValue as Quantity;

mod groups;
mod verdicts;

pub(crate) use groups::{GroupConflict, Intersection};
pub(crate) use verdicts::{explain_requests, node_devices};

/// The most devices one claim's allocation may hold (`AllocationResultsMaxSize`).
pub(crate) const MAX_RESULTS: usize = 32;

/// A device on the node, by position in [`Allocator`]'s pools.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    pool: usize,
    slice: usize,
    device: usize,
}

/// One way of satisfying a request: the request itself, or one `firstAvailable` subrequest.
struct Alternative<'a> {
    /// `request` or `request/subrequest`, as results and configs name it.
    name: String,
    /// The main request's name.
    base: &'a str,
    class: &'a model::Class,
    selectors: &'a [model::Selector],
    all: bool,
    /// Devices to allocate (for `All`: how many matched).
    count: usize,
    admin: bool,
    tolerations: Vec<model::Toleration>,
    raw_tolerations: &'a [Value],
    capacity: BTreeMap<String, Quantity>,
    /// `derivedAttributes`: values constraints compare instead of the device's attributes.
    derived: &'a [model::DerivedAttribute],
    /// For `All`: the candidates that match, decided before the search.
    all_devices: Vec<usize>,
}

/// A request of the claim with its alternatives (one unless `firstAvailable`).
struct Slot<'a> {
    name: &'a str,
    first_available: bool,
    alternatives: Vec<Alternative<'a>>,
}

/// A `matchAttribute` or `distinctAttribute` constraint with the values of the devices added so
/// far, kept as a stack so that backtracking can pop them.
struct ConstraintState {
    requests: Vec<String>,
    attribute: String,
    kind: ConstraintKind,
    values: Vec<Vec<AttributeValue>>,
}

/// Whether a constraint naming `requests` applies to the request `full` (`request`, or
/// `request/subrequest` of the request `base`): all requests when it names none, and a request
/// name covers its subrequests.
pub(crate) fn constraint_applies(requests: &[String], base: &str, full: &str) -> bool {
    requests.is_empty() || requests.iter().any(|r| r == base || r == full)
}

impl ConstraintState {
    fn applies(&self, base: &str, full: &str) -> bool {
        constraint_applies(&self.requests, base, full)
    }

    /// Adds a device, its attribute looked up by `value` (a derived attribute of the request
    /// shadows the device's attribute of that name).
    fn add<'v>(
        &mut self,
        base: &str,
        full: &str,
        value: impl FnOnce(&str) -> Option<&'v Vec<AttributeValue>>,
    ) -> bool {
        if !self.applies(base, full) {
            return true;
        }
        let Some(value) = value(&self.attribute) else {
            return false;
        };
        let fits = match self.kind {
            // Set semantics: the values all devices have in common must not become empty.
            ConstraintKind::MatchAttribute => value
                .iter()
                .any(|v| self.values.iter().all(|seen| seen.contains(v))),
            ConstraintKind::DistinctAttribute => self
                .values
                .iter()
                .all(|seen| !value.iter().any(|v| seen.contains(v))),
        };
        if fits {
            self.values.push(value.clone());
        }
        fits
    }

    fn remove(&mut self, base: &str, full: &str) {
        if self.applies(base, full) {
            self.values.pop();
        }
    }
}

/// Why a matching device cannot be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Blocked {
    Allocated,
    Tainted,
    Capacity,
    Counters,
    Groups,
}

/// Why a matching device cannot be taken, with the details an explanation reports.
#[derive(Clone, Debug)]
pub(crate) enum Unavailable {
    /// Held by another claim, or already by this one.
    Allocated,
    /// This taint is not tolerated.
    Tainted(Box<model::Taint>),
    /// The capacity does not serve the request.
    Capacity(Box<CapacityShortfall>),
    /// The pool's shared counters are used up.
    Counters(Box<CounterShortfall>),
    /// Its compatibility groups do not go with the devices placed on one of its counter sets.
    Groups(Box<GroupConflict>),
}

impl Unavailable {
    fn blocked(&self) -> Blocked {
        match self {
            Unavailable::Allocated => Blocked::Allocated,
            Unavailable::Tainted(_) => Blocked::Tainted,
            Unavailable::Capacity(_) => Blocked::Capacity,
            Unavailable::Counters(_) => Blocked::Counters,
            Unavailable::Groups(_) => Blocked::Groups,
        }
    }
}

/// A counter of a device's counter set that its pool has too little of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CounterShortfall {
    pub(crate) set: String,
    pub(crate) counter: String,
    pub(crate) needed: Quantity,
    pub(crate) left: Quantity,
}

/// A device taken during the search.
struct Chosen {
    slot: usize,
    alternative: usize,
    candidate: usize,
    admin: bool,
    /// For a share of a multi-allocatable device: what it consumes.
    share: Option<BTreeMap<String, Quantity>>,
    took_counters: bool,
    /// The compatibility-group state of the device's counter sets before it was taken.
    previous_groups: Vec<(String, Intersection)>,
}

/// Why the search stopped short of an answer.
enum Abort {
    Error(AllocationError),
    /// The next step would exceed [`MAX_RESULTS`]; callers may try an alternative needing fewer.
    TooMany,
}

impl From<AllocationError> for Abort {
    fn from(error: AllocationError) -> Self {
        Abort::Error(error)
    }
}

/// Compiled selectors and per-device CEL contexts, and which device matches which alternative.
struct Selection<'a> {
    env: Option<&'a CelEnvironment>,
    env_error: Option<&'a str>,
    tolerate_missing_attributes: bool,
    claim_name: &'a str,
    programs: HashMap<String, Result<Program, String>>,
    contexts: HashMap<usize, Result<Context<'static, 'static>, String>>,
    matches: HashMap<(usize, usize, usize), bool>,
    /// Derived attribute values per (request, alternative, candidate).
    derived: HashMap<(usize, usize, usize), DerivedValues>,
}

/// A device's derived attribute values for one alternative: name → values.
type DerivedValues = BTreeMap<String, Vec<AttributeValue>>;

impl Selection<'_> {
    /// The values of the alternative's derived attributes for a device that passed its
    /// selectors. Any failure (compile, runtime, result type) aborts the allocation, as in the
    /// scheduler.
    fn derived(
        &mut self,
        key: (usize, usize, usize),
        alternative: &Alternative<'_>,
        driver: &str,
        device: &DeviceData,
        device_id: impl FnOnce() -> String,
    ) -> Result<&DerivedValues, AllocationError> {
        if !self.derived.contains_key(&key) {
            let mut values = DerivedValues::new();
            let mut device_id = Some(device_id);
            for derived in alternative.derived {
                let mut failed = |message: String| AllocationError::DerivedAttribute {
                    claim: self.claim_name.to_owned(),
                    request: alternative.name.clone(),
                    name: derived.name.clone(),
                    device: device_id.take().map(|id| id()).unwrap_or_default(),
                    message: format!("{message} (expression: {})", derived.expression),
                };
                let Some(env) = self.env else {
                    return Err(AllocationError::CelEnvironment(
                        self.env_error.unwrap_or_default().to_owned(),
                    ));
                };
                let program = match self
                    .programs
                    .entry(derived.expression.clone())
                    .or_insert_with(|| env.compile(&derived.expression))
                {
                    Ok(program) => program,
                    Err(message) => {
                        let first = message.lines().next().unwrap_or_default().to_owned();
                        return Err(failed(format!("CEL compile error: {first}")));
                    }
                };
                let context = match self
                    .contexts
                    .entry(key.2)
                    .or_insert_with(|| env.device_context(driver, &device.raw))
                {
                    Ok(context) => context,
                    Err(message) => {
                        let message = format!("CEL runtime error: {message}");
                        return Err(failed(message));
                    }
                };
                let value = derived_value(program, context)
                    .map_err(|message| failed(format!("CEL runtime error: {message}")))?;
                values.insert(derived.name.clone(), value);
            }
            self.derived.insert(key, values);
        }
        Ok(&self.derived[&key])
    }

    fn selectable(
        &mut self,
        key: (usize, usize, usize),
        alternative: &Alternative<'_>,
        driver: &str,
        device: &DeviceData,
    ) -> Result<bool, AllocationError> {
        if let Some(matches) = self.matches.get(&key) {
            return Ok(*matches);
        }
        let class_owner = format!("class {}", alternative.class.metadata.name());
        let request_owner = format!("claim {}, request {}", self.claim_name, alternative.name);
        let matches = self.selectors_match(
            &class_owner,
            &alternative.class.spec.selectors,
            key.2,
            driver,
            device,
        )? && self.selectors_match(
            &request_owner,
            alternative.selectors,
            key.2,
            driver,
            device,
        )?;
        self.matches.insert(key, matches);
        Ok(matches)
    }

    fn selectors_match(
        &mut self,
        owner: &str,
        selectors: &[model::Selector],
        candidate: usize,
        driver: &str,
        device: &DeviceData,
    ) -> Result<bool, AllocationError> {
        match self.check_selectors(selectors, candidate, driver, device)? {
            None => Ok(true),
            Some(SelectorMiss::False { .. }) => Ok(false),
            Some(SelectorMiss::Compile {
                index,
                expression,
                message,
            }) => Err(AllocationError::CelCompile {
                owner: owner.to_owned(),
                index,
                expression: expression.to_owned(),
                message,
            }),
            Some(SelectorMiss::Runtime { message, .. })
                if self.tolerate_missing_attributes && message.starts_with("no such key") =>
            {
                Ok(false)
            }
            Some(SelectorMiss::Runtime {
                index,
                expression,
                message,
            }) => Err(AllocationError::CelRuntime {
                owner: owner.to_owned(),
                index,
                expression: expression.to_owned(),
                message,
            }),
        }
    }

    /// Evaluates the selectors in order and stops at the first that does not yield `true`.
    /// `Err` only when there is no CEL environment.
    fn check_selectors<'s>(
        &mut self,
        selectors: &'s [model::Selector],
        candidate: usize,
        driver: &str,
        device: &DeviceData,
    ) -> Result<Option<SelectorMiss<'s>>, AllocationError> {
        for (index, selector) in selectors.iter().enumerate() {
            // Presence was checked when the alternatives were built.
            let Some(cel) = &selector.cel else { continue };
            let expression = cel.expression.as_str();
            let Some(env) = self.env else {
                return Err(AllocationError::CelEnvironment(
                    self.env_error.unwrap_or_default().to_owned(),
                ));
            };
            let program = match self
                .programs
                .entry(expression.to_owned())
                .or_insert_with(|| env.compile(expression))
            {
                Ok(program) => program,
                Err(message) => {
                    return Ok(Some(SelectorMiss::Compile {
                        index,
                        expression,
                        message: message.clone(),
                    }));
                }
            };
            let context = match self
                .contexts
                .entry(candidate)
                .or_insert_with(|| env.device_context(driver, &device.raw))
            {
                Ok(context) => context,
                Err(message) => {
                    return Ok(Some(SelectorMiss::Runtime {
                        index,
                        expression,
                        message: message.clone(),
                    }));
                }
            };
            match device_matches(program, context) {
                Ok(true) => {}
                Ok(false) => return Ok(Some(SelectorMiss::False { index, expression })),
                Err(message) => {
                    return Ok(Some(SelectorMiss::Runtime {
                        index,
                        expression,
                        message,
                    }));
                }
            }
        }
        Ok(None)
    }
}

/// The first selector of a list that did not yield `true` for a device.
#[derive(Debug)]
enum SelectorMiss<'s> {
    /// It evaluated to `false`.
    False { index: usize, expression: &'s str },
    /// It does not compile.
    Compile {
        index: usize,
        expression: &'s str,
        message: String,
    },
    /// It failed on this device (a missing attribute is `no such key: <name>`).
    Runtime {
        index: usize,
        expression: &'s str,
        message: String,
    },
}

/// Everything fixed for one allocation.
struct Problem<'a> {
    allocator: &'a Allocator,
    claim: &'a model::Claim,
    claim_name: String,
    node: NodeView<'a>,
    candidates: Vec<Candidate>,
    /// Pools with devices for this node, by index.
    pools_on_node: Vec<usize>,
    slots: Vec<Slot<'a>>,
}

impl Problem<'_> {
    fn pool(&self, candidate: usize) -> &PoolData {
        &self.allocator.pools[self.candidates[candidate].pool]
    }

    fn slice(&self, candidate: usize) -> &SliceData {
        let c = self.candidates[candidate];
        &self.allocator.pools[c.pool].slices[c.slice]
    }

    fn device(&self, candidate: usize) -> &DeviceData {
        let c = self.candidates[candidate];
        &self.allocator.pools[c.pool].slices[c.slice].devices[c.device]
    }

    fn usable(&self, candidate: usize) -> bool {
        let pool = self.pool(candidate);
        !pool.incomplete && pool.invalid.is_none()
    }
}

/// The search state; every change made while trying a device is undone when backtracking.
struct State {
    /// Held exclusively by another claim.
    taken_by_others: Vec<bool>,
    /// Held in any way by another claim (its counters are already consumed).
    held_by_others: Vec<bool>,
    /// Capacity consumed by shares: of other claims and of this one so far.
    shared_used: Vec<BTreeMap<String, Quantity>>,
    /// How often each candidate was taken by this claim.
    in_claim: Vec<u32>,
    /// Per pool: counter set → counter → what is left.
    counters_left: HashMap<usize, BTreeMap<String, BTreeMap<String, Quantity>>>,
    /// Per pool: counter set → the compatibility groups of the devices placed on it.
    groups: HashMap<usize, BTreeMap<String, Intersection>>,
    constraints: Vec<ConstraintState>,
    chosen: Vec<Chosen>,
    selected: Vec<usize>,
    steps: u64,
}

struct Search<'a> {
    problem: &'a Problem<'a>,
    selection: Selection<'a>,
    state: State,
}

pub(crate) fn allocate(
    allocator: &Allocator,
    claim: &model::Claim,
    node_name: &str,
) -> Result<Value, AllocationError> {
    let claim_name = claim.display_name();
    let no_labels = BTreeMap::new();
    let node = NodeView {
        name: node_name,
        labels: allocator.node_labels.get(node_name).unwrap_or(&no_labels),
    };

    let (candidates, pools_on_node) = candidates_for(allocator, node);

    let mut slots = Vec::with_capacity(claim.spec.devices.requests.len());
    for request in &claim.spec.devices.requests {
        slots.push(build_slot(allocator, &claim_name, request)?);
    }
    let (cel_env, cel_error) = match &allocator.cel {
        Ok(env) => (Some(env), None),
        Err(error) => (None, Some(error.as_str())),
    };
    let mut selection = Selection {
        env: cel_env,
        env_error: cel_error,
        tolerate_missing_attributes: allocator.tolerate_missing_attributes,
        claim_name: &claim_name,
        programs: HashMap::new(),
        contexts: HashMap::new(),
        matches: HashMap::new(),
        derived: HashMap::new(),
    };
    let mut problem = Problem {
        allocator,
        claim,
        claim_name: claim_name.clone(),
        node,
        candidates,
        pools_on_node,
        slots,
    };

    // "All" requests: which devices they take is known up front, and an incomplete or invalid
    // pool means "all" cannot be known.
    let mut all_devices: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    for (slot_index, slot) in problem.slots.iter().enumerate() {
        for (alt_index, alternative) in slot.alternatives.iter().enumerate() {
            if !alternative.all {
                continue;
            }
            for &pool_index in &problem.pools_on_node {
                let pool = &allocator.pools[pool_index];
                if pool.incomplete {
                    return Err(AllocationError::PoolBeingUpdated {
                        claim: claim_name.clone(),
                        request: alternative.name.clone(),
                        pool: pool.id(),
                    });
                }
                if let Some(reason) = &pool.invalid {
                    return Err(AllocationError::InvalidPool {
                        claim: claim_name.clone(),
                        request: alternative.name.clone(),
                        pool: pool.id(),
                        reason: reason.clone(),
                    });
                }
            }
            let mut matching = Vec::new();
            for candidate in 0..problem.candidates.len() {
                let driver = &problem.pool(candidate).driver;
                if selection.selectable(
                    (slot_index, alt_index, candidate),
                    alternative,
                    driver,
                    problem.device(candidate),
                )? {
                    matching.push(candidate);
                }
            }
            all_devices.push(((slot_index, alt_index), matching));
        }
    }
    for ((slot_index, alt_index), matching) in all_devices {
        let alternative = &mut problem.slots[slot_index].alternatives[alt_index];
        alternative.count = matching.len();
        alternative.all_devices = matching;
    }
    let minimum: usize = problem
        .slots
        .iter()
        .map(|slot| slot.alternatives.iter().map(|a| a.count).min().unwrap_or(0))
        .sum();
    if minimum > MAX_RESULTS {
        return Err(AllocationError::TooManyDevices {
            claim: claim_name,
            requested: minimum,
            limit: MAX_RESULTS,
        });
    }

    let constraints = claim
        .spec
        .devices
        .constraints
        .iter()
        .enumerate()
        .map(|(index, constraint)| {
            let (kind, attribute) = match constraint.kind() {
                Some((kind, attribute)) => (kind, attribute.clone()),
                None => {
                    return Err(AllocationError::InvalidClaim {
                        claim: claim_name.clone(),
                        reason: format!(
                            "constraint #{index}: exactly one of matchAttribute and distinctAttribute must be set"
                        ),
                    });
                }
            };
            Ok(ConstraintState { requests: constraint.requests.clone(), attribute, kind, values: Vec::new() })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let state = initial_state(&problem, constraints);
    let mut search = Search {
        problem: &problem,
        selection,
        state,
    };
    debug!(claim = %claim_name, node = node_name, candidates = problem.candidates.len(), "allocating");
    let found = match search.allocate_one(0, 0, 0, false) {
        Ok(found) => found,
        Err(Abort::Error(error)) => return Err(error),
        Err(Abort::TooMany) => {
            return Err(AllocationError::TooManyDevices {
                claim: claim_name,
                requested: minimum,
                limit: MAX_RESULTS,
            });
        }
    };
    debug!(claim = %claim_name, found, steps = search.state.steps, "search finished");
    if !found {
        let problems = search.diagnose()?;
        let skipped_pools = problem
            .pools_on_node
            .iter()
            .filter_map(|&index| {
                let pool = &allocator.pools[index];
                match (&pool.invalid, pool.incomplete) {
                    (Some(reason), _) => Some(format!("{} (invalid: {reason})", pool.id())),
                    (None, true) => Some(format!("{} (being updated)", pool.id())),
                    (None, false) => None,
                }
            })
            .collect();
        return Err(AllocationError::Unsatisfiable {
            claim: claim_name,
            node: node_name.to_owned(),
            problems,
            skipped_pools,
        });
    }
    search.result()
}

/// The devices for the node, in allocation order, and the pools with devices for it.
fn candidates_for(allocator: &Allocator, node: NodeView<'_>) -> (Vec<Candidate>, Vec<usize>) {
    let mut candidates = Vec::new();
    let mut pools_on_node = Vec::new();
    for (pool_index, pool) in allocator.pools.iter().enumerate() {
        let mut on_node = false;
        for (slice_index, slice) in pool.slices.iter().enumerate() {
            if !slice_targets_node(slice, node) {
                continue;
            }
            on_node |= !slice.devices.is_empty();
            for (device_index, device) in slice.devices.iter().enumerate() {
                if slice.per_device && !device_targets_node(&device.raw, node) {
                    continue;
                }
                candidates.push(Candidate {
                    pool: pool_index,
                    slice: slice_index,
                    device: device_index,
                });
            }
        }
        if on_node {
            pools_on_node.push(pool_index);
        }
    }
    (candidates, pools_on_node)
}

fn slice_targets_node(slice: &SliceData, node: NodeView<'_>) -> bool {
    if slice.per_device || slice.all_nodes {
        return true;
    }
    if let Some(name) = &slice.node_name {
        return name == node.name;
    }
    slice
        .node_selector
        .as_ref()
        .is_some_and(|selector| selector_matches(selector, node))
}

fn device_targets_node(device: &model::Device, node: NodeView<'_>) -> bool {
    if device.all_nodes.unwrap_or(false) {
        return true;
    }
    if let Some(name) = &device.node_name {
        return name == node.name;
    }
    device
        .node_selector
        .as_ref()
        .is_some_and(|selector| selector_matches(selector, node))
}

fn build_slot<'a>(
    allocator: &'a Allocator,
    claim_name: &str,
    request: &'a model::Request,
) -> Result<Slot<'a>, AllocationError> {
    let invalid = |reason: String| AllocationError::InvalidClaim {
        claim: claim_name.to_owned(),
        reason,
    };
    match (&request.exactly, request.first_available.as_slice()) {
        (Some(exact), []) => {
            let alternative = build_alternative(
                allocator,
                claim_name,
                request.name.clone(),
                &request.name,
                AlternativeSpec {
                    class: &exact.device_class_name,
                    selectors: &exact.selectors,
                    mode: exact.allocation_mode.as_deref(),
                    count: exact.count,
                    admin: exact.admin_access.unwrap_or(false),
                    tolerations: &exact.tolerations,
                    capacity: exact.capacity.as_ref(),
                    derived: &exact.derived_attributes,
                },
            )?;
            Ok(Slot {
                name: &request.name,
                first_available: false,
                alternatives: vec![alternative],
            })
        }
        (None, subrequests) if !subrequests.is_empty() => {
            let alternatives = subrequests
                .iter()
                .map(|sub| {
                    build_alternative(
                        allocator,
                        claim_name,
                        format!("{}/{}", request.name, sub.name),
                        &request.name,
                        AlternativeSpec {
                            class: &sub.device_class_name,
                            selectors: &sub.selectors,
                            mode: sub.allocation_mode.as_deref(),
                            count: sub.count,
                            admin: false,
                            tolerations: &sub.tolerations,
                            capacity: sub.capacity.as_ref(),
                            derived: &sub.derived_attributes,
                        },
                    )
                })
                .collect::<Result<_, _>>()?;
            Ok(Slot {
                name: &request.name,
                first_available: true,
                alternatives,
            })
        }
        _ => Err(invalid(format!(
            "request {}: exactly one of exactly and firstAvailable must be set",
            request.name
        ))),
    }
}

struct AlternativeSpec<'a> {
    class: &'a str,
    selectors: &'a [model::Selector],
    mode: Option<&'a str>,
    count: Option<i64>,
    admin: bool,
    tolerations: &'a [Value],
    capacity: Option<&'a model::CapacityRequirements>,
    derived: &'a [model::DerivedAttribute],
}

fn build_alternative<'a>(
    allocator: &'a Allocator,
    claim_name: &str,
    name: String,
    base: &'a str,
    spec: AlternativeSpec<'a>,
) -> Result<Alternative<'a>, AllocationError> {
    let invalid = |reason: String| AllocationError::InvalidClaim {
        claim: claim_name.to_owned(),
        reason,
    };
    let class =
        allocator
            .classes
            .get(spec.class)
            .ok_or_else(|| AllocationError::UnknownDeviceClass {
                claim: claim_name.to_owned(),
                request: name.clone(),
                class: spec.class.to_owned(),
            })?;
    for (index, selector) in spec.selectors.iter().enumerate() {
        if selector.cel.is_none() {
            return Err(invalid(format!(
                "request {name}, selector #{index}: CEL expression empty (unsupported selector type?)"
            )));
        }
    }
    for (index, selector) in class.spec.selectors.iter().enumerate() {
        if selector.cel.is_none() {
            return Err(invalid(format!(
                "class {}, selector #{index}: CEL expression empty (unsupported selector type?)",
                class.metadata.name()
            )));
        }
    }
    let (all, count) = match spec.mode.unwrap_or("ExactCount") {
        "ExactCount" => {
            let count = spec.count.unwrap_or(1);
            if count <= 0 {
                return Err(invalid(format!(
                    "request {name}: count must be greater than zero, got {count}"
                )));
            }
            // Anything beyond the result limit fails the size check right after.
            (false, usize::try_from(count).unwrap_or(usize::MAX))
        }
        "All" => (true, 0),
        other => {
            return Err(invalid(format!(
                "request {name}: unsupported allocation mode {other}"
            )));
        }
    };
    let tolerations = spec
        .tolerations
        .iter()
        .map(|value| serde_json::from_value(value.clone()))
        .collect::<Result<_, _>>()
        .map_err(|error| invalid(format!("request {name}: malformed toleration: {error}")))?;
    let capacity = spec
        .capacity
        .map(|requirements| &requirements.requests)
        .into_iter()
        .flatten()
        .map(|(key, text)| {
            Quantity::parse(text)
                .map(|q| (key.clone(), q))
                .map_err(|error| invalid(format!("request {name}: capacity {key}: {error}")))
        })
        .collect::<Result<_, _>>()?;
    Ok(Alternative {
        name,
        base,
        class,
        selectors: spec.selectors,
        all,
        count,
        admin: spec.admin,
        tolerations,
        raw_tolerations: spec.tolerations,
        capacity,
        derived: spec.derived,
        all_devices: Vec::new(),
    })
}

fn initial_state(problem: &Problem<'_>, constraints: Vec<ConstraintState>) -> State {
    // Devices of other claims, by (driver, pool, device): held whole, or shares with what they
    // consume.
    let mut exclusive: HashSet<(&str, &str, &str)> = HashSet::new();
    let mut shared: HashMap<(&str, &str, &str), BTreeMap<String, Quantity>> = HashMap::new();
    let allocator = problem.allocator;
    for held in allocator
        .held
        .iter()
        .filter(|held| !held.is_same_claim(problem.claim))
    {
        for device in &held.devices {
            let key = (
                device.driver.as_str(),
                device.pool.as_str(),
                device.device.as_str(),
            );
            match &device.share {
                None => {
                    exclusive.insert(key);
                }
                Some(consumed) => {
                    let used = shared.entry(key).or_default();
                    for (name, amount) in consumed {
                        let total = used
                            .get(name)
                            .copied()
                            .unwrap_or_default()
                            .checked_add(*amount);
                        used.insert(name.clone(), total.unwrap_or(*amount));
                    }
                }
            }
        }
    }
    let is_held = |pool: &PoolData, device: &DeviceData| {
        let key = (
            pool.driver.as_str(),
            pool.name.as_str(),
            device.raw.name.as_str(),
        );
        (exclusive.contains(&key), shared.get(&key).cloned())
    };
    let count = problem.candidates.len();
    let mut state = State {
        taken_by_others: Vec::with_capacity(count),
        held_by_others: Vec::with_capacity(count),
        shared_used: Vec::with_capacity(count),
        in_claim: vec![0; count],
        counters_left: HashMap::new(),
        groups: HashMap::new(),
        constraints,
        chosen: Vec::new(),
        selected: vec![0; problem.slots.len()],
        steps: 0,
    };
    for candidate in 0..count {
        let (taken, share) = is_held(problem.pool(candidate), problem.device(candidate));
        state.taken_by_others.push(taken);
        state.held_by_others.push(taken || share.is_some());
        state.shared_used.push(share.unwrap_or_default());
    }
    // Counters left in each pool on the node: what the sets offer minus what held devices take,
    // wherever those devices are published.
    for &pool_index in &problem.pools_on_node {
        let pool = &allocator.pools[pool_index];
        if pool.counter_sets.is_empty() {
            continue;
        }
        let mut left = pool.counter_sets.clone();
        // Compatibility groups of held devices are read from the slices as they are now, like
        // the scheduler does (the allocation result records none).
        let mut groups: BTreeMap<String, Intersection> = BTreeMap::new();
        for device in pool.slices.iter().flat_map(|slice| &slice.devices) {
            let (taken, share) = is_held(pool, device);
            if !taken && share.is_none() {
                continue;
            }
            for (set, declared) in &device.groups {
                let placed = groups.entry(set.clone()).or_default();
                *placed = placed.with(declared);
            }
            for (set, counters) in &device.counters {
                let Some(available) = left.get_mut(set) else {
                    continue;
                };
                for (name, amount) in counters {
                    if let Some(value) = available.get_mut(name) {
                        // Over-consumption leaves a negative balance: nothing is available.
                        *value = value.checked_sub(*amount).unwrap_or(Quantity::ZERO);
                    }
                }
            }
        }
        state.counters_left.insert(pool_index, left);
        state.groups.insert(pool_index, groups);
    }
    state
}

/// The first taint of the device that keeps it from being allocated with these tolerations.
fn untolerated_taint<'d>(
    device: &'d model::Device,
    tolerations: &[model::Toleration],
) -> Option<&'d model::Taint> {
    device.taints.iter().find(|taint| {
        // Only these effects keep devices from being allocated; unknown ones count as None.
        matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations
                .iter()
                .any(|toleration| tolerates(toleration, taint))
    })
}

fn tolerates(toleration: &model::Toleration, taint: &model::Taint) -> bool {
    if toleration
        .effect
        .as_deref()
        .is_some_and(|effect| !effect.is_empty() && effect != taint.effect)
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// Why a device's capacity does not serve a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CapacityShortfall {
    /// The request asks for a capacity the device does not have.
    Missing { capacity: String },
    /// Without sharing: the device has less than requested.
    TooSmall {
        capacity: String,
        requested: Quantity,
        available: Quantity,
    },
    /// With sharing: the request policy does not allow the amount.
    Policy {
        capacity: String,
        amount: Quantity,
        reason: String,
    },
    /// With sharing: the amount does not fit next to the shares already taken.
    Exhausted {
        capacity: String,
        needed: Quantity,
        used: Quantity,
        total: Quantity,
    },
}

/// What one share takes of each capacity, rounded up to the request policy, or why the policy
/// forbids the amount or it does not fit next to `used`.
fn share_consumption_detail(
    requested: &BTreeMap<String, Quantity>,
    capacity: &BTreeMap<String, CapacityData>,
    used: &BTreeMap<String, Quantity>,
) -> Result<BTreeMap<String, Quantity>, CapacityShortfall> {
    if let Some(name) = requested.keys().find(|name| !capacity.contains_key(*name)) {
        return Err(CapacityShortfall::Missing {
            capacity: name.clone(),
        });
    }
    let mut consumption = BTreeMap::new();
    for (name, data) in capacity {
        let policy = |amount: Quantity, reason: String| CapacityShortfall::Policy {
            capacity: name.clone(),
            amount,
            reason,
        };
        let amount = match requested.get(name) {
            None => data.default.unwrap_or(data.value),
            Some(&asked) => match (&data.range, &data.valid_values) {
                (Some(range), _) => match range.step {
                    Some(step) => asked.round_up_to_step(range.min, step).ok_or_else(|| {
                        policy(
                            asked,
                            format!(
                                "cannot be rounded up to validRange.min {} plus a multiple of step {step}",
                                range.min
                            ),
                        )
                    })?,
                    None => asked.max(range.min),
                },
                (None, Some(values)) => values
                    .iter()
                    .copied()
                    .find(|v| asked <= *v)
                    .unwrap_or(asked),
                (None, None) => asked,
            },
        };
        let refusal = if data.default == Some(amount) {
            None
        } else {
            match (&data.range, &data.valid_values) {
                (Some(range), _) => match (range.max, range.step) {
                    (Some(max), _) if amount > max => Some(format!("above validRange.max {max}")),
                    (_, Some(step)) if !amount.is_on_step(range.min, step) => Some(format!(
                        "not validRange.min {} plus a multiple of step {step}",
                        range.min
                    )),
                    _ => None,
                },
                (None, Some(values)) if !values.contains(&amount) => Some(format!(
                    "not one of validValues {}",
                    values
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                _ => None,
            }
        };
        if let Some(reason) = refusal {
            return Err(policy(amount, reason));
        }
        let already = used.get(name).copied().unwrap_or_default();
        let exhausted = || CapacityShortfall::Exhausted {
            capacity: name.clone(),
            needed: amount,
            used: already,
            total: data.value,
        };
        let total = already.checked_add(amount).ok_or_else(exhausted)?;
        if total > data.value {
            return Err(exhausted());
        }
        consumption.insert(name.clone(), amount);
    }
    Ok(consumption)
}

impl Search<'_> {
    /// Tries to allocate device number `device` of `alternative` of request `slot` and,
    /// recursively, everything after it. Mirrors the scheduler's `allocateOne`.
    fn allocate_one(
        &mut self,
        slot: usize,
        alternative: usize,
        device: usize,
        in_alternative: bool,
    ) -> Result<bool, Abort> {
        let problem = self.problem;
        self.state.steps += 1;
        if self.state.steps > problem.allocator.search_limit {
            return Err(Abort::Error(AllocationError::SearchLimit {
                claim: problem.claim_name.clone(),
                steps: problem.allocator.search_limit,
            }));
        }
        let Some(request) = problem.slots.get(slot) else {
            return Ok(true);
        };
        if request.first_available && !in_alternative {
            let mut all_too_many = true;
            for index in 0..request.alternatives.len() {
                match self.allocate_one(slot, index, 0, true) {
                    // Another subrequest may need fewer devices.
                    Err(Abort::TooMany) => continue,
                    Err(error) => return Err(error),
                    Ok(true) => {
                        self.state.selected[slot] = index;
                        return Ok(true);
                    }
                    Ok(false) => all_too_many = false,
                }
            }
            return if all_too_many {
                Err(Abort::TooMany)
            } else {
                Ok(false)
            };
        }
        let wanted = &request.alternatives[alternative];
        if wanted.all && wanted.all_devices.is_empty() {
            // "All" needs at least one device.
            return Ok(false);
        }
        if device >= wanted.count {
            self.state.selected[slot] = alternative;
            return self.allocate_one(slot + 1, 0, 0, false);
        }
        if self.state.chosen.len() + wanted.count - device > MAX_RESULTS {
            return Err(Abort::TooMany);
        }
        if wanted.all {
            let candidate = wanted.all_devices[device];
            if !self.try_device(slot, alternative, candidate, true)? {
                // The order does not matter for "all": if one cannot be had, none can.
                return Ok(false);
            }
            let done = self.allocate_one(slot, alternative, device + 1, in_alternative);
            if !matches!(done, Ok(true)) {
                self.undo_last();
            }
            return done;
        }
        for candidate in 0..problem.candidates.len() {
            if !problem.usable(candidate) {
                continue;
            }
            let driver = &problem.pool(candidate).driver;
            if !self.selection.selectable(
                (slot, alternative, candidate),
                wanted,
                driver,
                problem.device(candidate),
            )? {
                continue;
            }
            if !self.try_device(slot, alternative, candidate, false)? {
                continue;
            }
            match self.allocate_one(slot, alternative, device + 1, in_alternative) {
                Ok(true) => return Ok(true),
                Ok(false) => self.undo_last(),
                Err(error) => {
                    self.undo_last();
                    return Err(error);
                }
            }
        }
        Ok(false)
    }

    /// Whether a matching device can be taken now, and for a share what it consumes.
    fn availability(
        &self,
        wanted: &Alternative<'_>,
        candidate: usize,
    ) -> Result<Option<BTreeMap<String, Quantity>>, Blocked> {
        self.availability_detail(wanted, candidate)
            .map_err(|unavailable| unavailable.blocked())
    }

    /// [`Self::availability`], saying why a device cannot be taken.
    fn availability_detail(
        &self,
        wanted: &Alternative<'_>,
        candidate: usize,
    ) -> Result<Option<BTreeMap<String, Quantity>>, Unavailable> {
        let problem = self.problem;
        let device = problem.device(candidate);
        let state = &self.state;
        if wanted.admin {
            // Admin access ignores other claims, but one claim gets a device only once.
            if state.in_claim[candidate] > 0 {
                return Err(Unavailable::Allocated);
            }
        } else if device.multi {
            // Other requests of the claim may share the device, but one request takes it only
            // once: kube-scheduler leaves a claim asking `count: 2` of a single shared device
            // pending (recorded: scenario 41).
            let same_request = state.chosen.iter().any(|chosen| {
                chosen.candidate == candidate
                    && problem.slots[chosen.slot].alternatives[chosen.alternative].name
                        == wanted.name
            });
            if state.taken_by_others[candidate] || same_request {
                return Err(Unavailable::Allocated);
            }
        } else if state.held_by_others[candidate] || state.in_claim[candidate] > 0 {
            return Err(Unavailable::Allocated);
        }
        if let Some(taint) = untolerated_taint(&device.raw, &wanted.tolerations) {
            return Err(Unavailable::Tainted(Box::new(taint.clone())));
        }
        if device.multi && !wanted.admin {
            let share = share_consumption_detail(
                &wanted.capacity,
                &device.capacity,
                &state.shared_used[candidate],
            )
            .map_err(|shortfall| Unavailable::Capacity(Box::new(shortfall)))?;
            if self.takes_counters(wanted, candidate) {
                if let Some(shortfall) = self.counters_shortfall(candidate) {
                    return Err(Unavailable::Counters(Box::new(shortfall)));
                }
                if let Some(conflict) = self.group_conflict(candidate) {
                    return Err(Unavailable::Groups(Box::new(conflict)));
                }
            }
            return Ok(Some(share));
        }
        // Without sharing, requested capacity only filters: the device must have that much.
        for (name, asked) in &wanted.capacity {
            match device.capacity.get(name) {
                None => {
                    return Err(Unavailable::Capacity(Box::new(
                        CapacityShortfall::Missing {
                            capacity: name.clone(),
                        },
                    )));
                }
                Some(data) if data.value < *asked => {
                    return Err(Unavailable::Capacity(Box::new(
                        CapacityShortfall::TooSmall {
                            capacity: name.clone(),
                            requested: *asked,
                            available: data.value,
                        },
                    )));
                }
                Some(_) => {}
            }
        }
        if self.takes_counters(wanted, candidate) {
            if let Some(shortfall) = self.counters_shortfall(candidate) {
                return Err(Unavailable::Counters(Box::new(shortfall)));
            }
            if let Some(conflict) = self.group_conflict(candidate) {
                return Err(Unavailable::Groups(Box::new(conflict)));
            }
        }
        Ok(None)
    }

    /// The first counter set of the device whose placed devices' compatibility groups do not
    /// admit it.
    fn group_conflict(&self, candidate: usize) -> Option<GroupConflict> {
        let pool = self.problem.candidates[candidate].pool;
        let placed = self.state.groups.get(&pool);
        for (set, groups) in &self.problem.device(candidate).groups {
            let current = placed
                .and_then(|placed| placed.get(set))
                .cloned()
                .unwrap_or_default();
            if !current.admits(groups) {
                return Some(GroupConflict {
                    set: set.clone(),
                    groups: groups.clone(),
                    placed: current,
                });
            }
        }
        None
    }

    /// Places the device's compatibility groups on its counter sets and returns what was
    /// there before, for [`Self::undo_last`].
    fn place_groups(&mut self, candidate: usize) -> Vec<(String, Intersection)> {
        let pool = self.problem.candidates[candidate].pool;
        let placed = self.state.groups.entry(pool).or_default();
        let mut previous = Vec::new();
        for (set, groups) in &self.problem.device(candidate).groups {
            let current = placed.entry(set.clone()).or_default();
            previous.push((set.clone(), current.clone()));
            *current = current.with(groups);
        }
        previous
    }

    fn takes_counters(&self, wanted: &Alternative<'_>, candidate: usize) -> bool {
        // A device consumes its counters once, however many shares of it exist.
        !wanted.admin
            && !self.problem.device(candidate).counters.is_empty()
            && !self.state.held_by_others[candidate]
            && self.state.in_claim[candidate] == 0
    }

    /// The first counter the device consumes more of than its pool has left.
    fn counters_shortfall(&self, candidate: usize) -> Option<CounterShortfall> {
        let pool = self.problem.candidates[candidate].pool;
        let left = self.state.counters_left.get(&pool);
        for (set, counters) in &self.problem.device(candidate).counters {
            for (name, amount) in counters {
                let have = left
                    .and_then(|left| left.get(set))
                    .and_then(|s| s.get(name));
                if have.is_none_or(|have| have < amount) {
                    return Some(CounterShortfall {
                        set: set.clone(),
                        counter: name.clone(),
                        needed: *amount,
                        left: have.copied().unwrap_or(Quantity::ZERO),
                    });
                }
            }
        }
        None
    }

    fn adjust_counters(&mut self, candidate: usize, take: bool) {
        let pool = self.problem.candidates[candidate].pool;
        let Some(left) = self.state.counters_left.get_mut(&pool) else {
            return;
        };
        for (set, counters) in &self.problem.device(candidate).counters {
            let Some(available) = left.get_mut(set) else {
                continue;
            };
            for (name, amount) in counters {
                if let Some(value) = available.get_mut(name) {
                    let next = if take {
                        value.checked_sub(*amount)
                    } else {
                        value.checked_add(*amount)
                    };
                    // Amounts were checked to fit, so neither direction overflows.
                    *value = next.unwrap_or(*value);
                }
            }
        }
    }

    /// Takes the device for the alternative if it is available and the constraints allow it.
    /// `must` (for "all" requests) turns a constraint violation into an error, like the
    /// scheduler: such a claim can never be satisfied.
    fn try_device(
        &mut self,
        slot: usize,
        alternative: usize,
        candidate: usize,
        must: bool,
    ) -> Result<bool, Abort> {
        let problem = self.problem;
        let wanted = &problem.slots[slot].alternatives[alternative];
        let share = match self.availability(wanted, candidate) {
            Ok(share) => share,
            Err(blocked) => {
                trace!(device = %device_id(problem, candidate), ?blocked, "device not available");
                return Ok(false);
            }
        };
        let device = problem.device(candidate);
        let no_derived = DerivedValues::new();
        let derived = if wanted.derived.is_empty() {
            &no_derived
        } else {
            let driver = &problem.pool(candidate).driver;
            self.selection.derived(
                (slot, alternative, candidate),
                wanted,
                driver,
                device,
                || device_id(problem, candidate),
            )?
        };
        for index in 0..self.state.constraints.len() {
            let value = |attribute: &str| {
                derived
                    .get(attribute)
                    .or_else(|| device.attributes.get(attribute))
            };
            if !self.state.constraints[index].add(wanted.base, &wanted.name, value) {
                for earlier in &mut self.state.constraints[..index] {
                    earlier.remove(wanted.base, &wanted.name);
                }
                if must {
                    return Err(Abort::Error(AllocationError::ConstraintRejectsDevice {
                        claim: problem.claim_name.clone(),
                        request: wanted.name.clone(),
                        device: device_id(problem, candidate),
                    }));
                }
                return Ok(false);
            }
        }
        let took_counters = self.takes_counters(wanted, candidate);
        let mut previous_groups = Vec::new();
        if took_counters {
            self.adjust_counters(candidate, true);
            previous_groups = self.place_groups(candidate);
        }
        if let Some(share) = &share {
            let used = &mut self.state.shared_used[candidate];
            for (name, amount) in share {
                let total = used
                    .get(name)
                    .copied()
                    .unwrap_or_default()
                    .checked_add(*amount);
                used.insert(name.clone(), total.unwrap_or(*amount));
            }
        }
        self.state.in_claim[candidate] += 1;
        self.state.chosen.push(Chosen {
            slot,
            alternative,
            candidate,
            admin: wanted.admin,
            share,
            took_counters,
            previous_groups,
        });
        Ok(true)
    }

    fn undo_last(&mut self) {
        let Some(chosen) = self.state.chosen.pop() else {
            return;
        };
        let problem = self.problem;
        let wanted = &problem.slots[chosen.slot].alternatives[chosen.alternative];
        for constraint in &mut self.state.constraints {
            constraint.remove(wanted.base, &wanted.name);
        }
        if chosen.took_counters {
            self.adjust_counters(chosen.candidate, false);
            let pool = problem.candidates[chosen.candidate].pool;
            if let Some(placed) = self.state.groups.get_mut(&pool) {
                for (set, previous) in chosen.previous_groups {
                    placed.insert(set, previous);
                }
            }
        }
        if let Some(share) = &chosen.share {
            let used = &mut self.state.shared_used[chosen.candidate];
            for (name, amount) in share {
                if let Some(value) = used.get_mut(name) {
                    *value = value.checked_sub(*amount).unwrap_or(*value);
                }
            }
        }
        self.state.in_claim[chosen.candidate] -= 1;
    }

    /// Why the search found nothing: each request on its own, then the combination.
    fn diagnose(&mut self) -> Result<Vec<RequestProblem>, AllocationError> {
        let problem = self.problem;
        let considered = (0..problem.candidates.len())
            .filter(|&c| problem.usable(c))
            .count();
        let mut problems = Vec::new();
        for (slot_index, slot) in problem.slots.iter().enumerate() {
            let mut reasons = Vec::new();
            for (alt_index, wanted) in slot.alternatives.iter().enumerate() {
                let mut matching = 0;
                let mut counts = BTreeMap::new();
                let candidates: Vec<usize> = if wanted.all {
                    wanted.all_devices.clone()
                } else {
                    (0..problem.candidates.len())
                        .filter(|&c| problem.usable(c))
                        .collect()
                };
                for candidate in candidates {
                    let driver = &problem.pool(candidate).driver;
                    let key = (slot_index, alt_index, candidate);
                    if !self
                        .selection
                        .selectable(key, wanted, driver, problem.device(candidate))?
                    {
                        continue;
                    }
                    matching += 1;
                    let outcome = self.availability(wanted, candidate).err();
                    *counts.entry(outcome).or_insert(0usize) += 1;
                }
                let available = counts.get(&None).copied().unwrap_or(0);
                let needed = if wanted.all { matching } else { wanted.count };
                let count = |blocked| counts.get(&Some(blocked)).copied().unwrap_or(0);
                let reason = if matching == 0 {
                    Some(UnsatisfiableReason::NoMatchingDevice { considered })
                } else if available < needed {
                    Some(UnsatisfiableReason::Unavailable {
                        needed,
                        matching,
                        available,
                        allocated: count(Blocked::Allocated),
                        tainted: count(Blocked::Tainted),
                        capacity: count(Blocked::Capacity),
                        counters: count(Blocked::Counters),
                        incompatible: count(Blocked::Groups),
                    })
                } else {
                    None
                };
                reasons.push((wanted.name.clone(), reason));
            }
            // A request fails on its own when none of its alternatives can work alone.
            if reasons.iter().all(|(_, reason)| reason.is_some()) {
                problems.extend(reasons.into_iter().filter_map(|(request, reason)| {
                    reason.map(|reason| RequestProblem { request, reason })
                }));
            }
        }
        if problems.is_empty() {
            let requests = problem
                .slots
                .iter()
                .map(|slot| slot.name)
                .collect::<Vec<_>>()
                .join(", ");
            problems.push(RequestProblem {
                request: requests,
                reason: UnsatisfiableReason::Combination,
            });
        }
        Ok(problems)
    }

    fn result(&self) -> Result<Value, AllocationError> {
        let problem = self.problem;
        let mut results = Vec::with_capacity(self.state.chosen.len());
        for chosen in &self.state.chosen {
            let wanted = &problem.slots[chosen.slot].alternatives[chosen.alternative];
            let pool = problem.pool(chosen.candidate);
            let device = problem.device(chosen.candidate);
            let mut result = Map::new();
            result.insert("request".into(), json!(wanted.name));
            result.insert("driver".into(), json!(pool.driver));
            result.insert("pool".into(), json!(pool.name));
            result.insert("device".into(), json!(device.raw.name));
            if chosen.admin {
                result.insert("adminAccess".into(), json!(true));
            }
            if !wanted.raw_tolerations.is_empty() {
                result.insert("tolerations".into(), json!(wanted.raw_tolerations));
            }
            if !device.raw.binding_conditions.is_empty() {
                result.insert(
                    "bindingConditions".into(),
                    json!(device.raw.binding_conditions),
                );
            }
            if !device.raw.binding_failure_conditions.is_empty() {
                result.insert(
                    "bindingFailureConditions".into(),
                    json!(device.raw.binding_failure_conditions),
                );
            }
            if let Some(share) = &chosen.share {
                result.insert("shareID".into(), json!(new_uid()));
                let consumed: Map<String, Value> = share
                    .iter()
                    .map(|(name, amount)| (name.clone(), json!(amount.to_string())))
                    .collect();
                result.insert("consumedCapacity".into(), Value::Object(consumed));
            }
            results.push(Value::Object(result));
        }

        let mut devices = Map::new();
        devices.insert("results".into(), Value::Array(results));
        // An empty list is left out, as in what the scheduler writes (`omitempty`): a claim
        // without configs has no `config` key (recorded: every scenario without one).
        let configs = self.configs();
        if !configs.is_empty() {
            devices.insert("config".into(), Value::Array(configs));
        }
        let mut allocation = Map::new();
        allocation.insert("devices".into(), Value::Object(devices));
        if let Some(selector) = self.node_selector()? {
            allocation.insert("nodeSelector".into(), selector);
        }
        Ok(Value::Object(allocation))
    }

    /// Class configs of each request's class first (each class once, listing the requests that
    /// use it), then the claim's configs that apply to an allocated request, in claim order.
    fn configs(&self) -> Vec<Value> {
        let problem = self.problem;
        let mut configs: Vec<Map<String, Value>> = Vec::new();
        let mut by_class: HashMap<&str, std::ops::Range<usize>> = HashMap::new();
        for (slot_index, slot) in problem.slots.iter().enumerate() {
            let wanted = &slot.alternatives[self.state.selected[slot_index]];
            let class = wanted.class.metadata.name();
            if let Some(range) = by_class.get(class) {
                for config in &mut configs[range.clone()] {
                    if let Some(Value::Array(requests)) = config.get_mut("requests") {
                        requests.push(json!(wanted.name));
                    }
                }
                continue;
            }
            let start = configs.len();
            for config in &wanted.class.spec.config {
                let mut entry = config.clone();
                entry.insert("source".into(), json!("FromClass"));
                entry.insert("requests".into(), json!([wanted.name]));
                configs.push(entry);
            }
            by_class.insert(class, start..configs.len());
        }
        for config in &problem.claim.spec.devices.config {
            let requests: Vec<&str> = match config.get("requests") {
                Some(Value::Array(requests)) => requests.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            let applies = requests.is_empty()
                || problem.slots.iter().enumerate().any(|(slot_index, slot)| {
                    let selected = &slot.alternatives[self.state.selected[slot_index]].name;
                    requests
                        .iter()
                        .any(|r| *r == slot.name || (slot.first_available && r == selected))
                });
            if applies {
                let mut entry = config.clone();
                entry.insert("source".into(), json!("FromClaim"));
                configs.push(entry);
            }
        }
        configs.into_iter().map(Value::Object).collect()
    }

    /// Where the allocation can be used: the node of any node-local device, else the union of
    /// the slices' node selector requirements, else everywhere (`None`).
    fn node_selector(&self) -> Result<Option<Value>, AllocationError> {
        let problem = self.problem;
        let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
        let mut expressions: Vec<NodeSelectorRequirement> = Vec::new();
        for chosen in &self.state.chosen {
            let slice = problem.slice(chosen.candidate);
            let device = &problem.device(chosen.candidate).raw;
            let (node_name, selector) = if slice.per_device {
                (device.node_name.as_deref(), device.node_selector.as_ref())
            } else {
                (slice.node_name.as_deref(), slice.node_selector.as_ref())
            };
            // A device bound to its node pins the allocation to the node it was chosen for.
            let node_name = if device.binds_to_node.unwrap_or(false) {
                Some(problem.node.name)
            } else {
                node_name
            };
            if let Some(node_name) = node_name {
                return Ok(Some(json!({ "nodeSelectorTerms": [{ "matchFields": [
                    { "key": "metadata.name", "operator": "In", "values": [node_name] }
                ] }] })));
            }
            let Some(selector) = selector else { continue };
            match selector.node_selector_terms.as_slice() {
                [] => {}
                [term] => {
                    add_new_requirements(&term.match_fields, &mut fields);
                    add_new_requirements(&term.match_expressions, &mut expressions);
                }
                terms => {
                    let wanted = &problem.slots[chosen.slot].alternatives[chosen.alternative];
                    return Err(AllocationError::InvalidPool {
                        claim: problem.claim_name.clone(),
                        request: wanted.name.clone(),
                        pool: problem.pool(chosen.candidate).id(),
                        reason: format!("unsupported node selector with {} terms", terms.len()),
                    });
                }
            }
        }
        if fields.is_empty() && expressions.is_empty() {
            return Ok(None);
        }
        let term = model::NodeSelectorTerm {
            match_expressions: expressions,
            match_fields: fields,
        };
        Ok(Some(json!({ "nodeSelectorTerms": [term] })))
    }
}

fn add_new_requirements(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for requirement in from {
        let same = |existing: &NodeSelectorRequirement| {
            let mut a = existing.values.clone();
            let mut b = requirement.values.clone();
            a.sort();
            a.dedup();
            b.sort();
            b.dedup();
            existing.key == requirement.key && existing.operator == requirement.operator && a == b
        };
        if !to.iter().any(same) {
            to.push(requirement.clone());
        }
    }
}

fn device_id(problem: &Problem<'_>, candidate: usize) -> String {
    let pool = problem.pool(candidate);
    format!(
        "{}/{}/{}",
        pool.driver,
        pool.name,
        problem.device(candidate).raw.name
    )
}

/// A random (version 4) UID for a share of a device, as the scheduler assigns.
fn new_uid() -> String {
    uuid::Builder::from_random_bytes(fastrand::u128(..).to_be_bytes())
        .into_uuid()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::RangeData;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap()
    }

    fn capacity(
        value: &str,
        default: Option<&str>,
        values: Option<&[&str]>,
        range: Option<(&str, Option<&str>, Option<&str>)>,
    ) -> CapacityData {
        CapacityData {
            value: q(value),
            default: default.map(q),
            valid_values: values.map(|values| values.iter().map(|v| q(v)).collect()),
            range: range.map(|(min, max, step)| RangeData {
                min: q(min),
                max: max.map(q),
                step: step.map(q),
            }),
        }
    }

    fn consume(requested: &[(&str, &str)], data: CapacityData, used: &str) -> Option<String> {
        let requested = requested
            .iter()
            .map(|(k, v)| (k.to_string(), q(v)))
            .collect();
        let capacities = BTreeMap::from([("bw".to_owned(), data)]);
        let used = BTreeMap::from([("bw".to_owned(), q(used))]);
        share_consumption_detail(&requested, &capacities, &used)
            .ok()
            .map(|c| c["bw"].to_string())
    }

    #[test]
    fn share_consumption_follows_the_request_policy() {
        let range = || {
            capacity(
                "10G",
                Some("1G"),
                None,
                Some(("1G", Some("4G"), Some("500M"))),
            )
        };
        assert_eq!(consume(&[], range(), "0"), Some("1G".into()), "default");
        assert_eq!(
            consume(&[("bw", "1200M")], range(), "0"),
            Some("1500M".into()),
            "rounded up to the step"
        );
        assert_eq!(
            consume(&[("bw", "100M")], range(), "0"),
            Some("1G".into()),
            "at least the minimum"
        );
        assert_eq!(
            consume(&[("bw", "5G")], range(), "0"),
            None,
            "above the maximum"
        );
        assert_eq!(
            consume(&[("bw", "4G")], range(), "7G"),
            None,
            "does not fit next to other shares"
        );
        assert_eq!(
            consume(&[("other", "1")], range(), "0"),
            None,
            "capacity the device does not have"
        );

        let values = || capacity("10G", Some("1G"), Some(&["1G", "4G"]), None);
        assert_eq!(consume(&[("bw", "2G")], values(), "0"), Some("4G".into()));
        assert_eq!(consume(&[("bw", "5G")], values(), "0"), None);

        let plain = || capacity("10G", None, None, None);
        assert_eq!(
            consume(&[], plain(), "0"),
            Some("10G".into()),
            "the whole capacity"
        );
        assert_eq!(consume(&[("bw", "3G")], plain(), "6G"), Some("3G".into()));
    }

    #[test]
    fn tolerations_match_like_kubernetes() {
        let taint = model::Taint {
            key: "k".into(),
            value: Some("v".into()),
            effect: "NoSchedule".into(),
        };
        let toleration = |key: Option<&str>,
                          operator: Option<&str>,
                          value: Option<&str>,
                          effect: Option<&str>| model::Toleration {
            key: key.map(Into::into),
            operator: operator.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
        };
        assert!(tolerates(
            &toleration(Some("k"), None, Some("v"), None),
            &taint
        ));
        assert!(tolerates(
            &toleration(Some("k"), Some("Exists"), None, Some("NoSchedule")),
            &taint
        ));
        assert!(
            tolerates(&toleration(None, Some("Exists"), None, None), &taint),
            "empty key with Exists tolerates all"
        );
        assert!(!tolerates(
            &toleration(Some("k"), None, Some("w"), None),
            &taint
        ));
        assert!(!tolerates(
            &toleration(Some("k"), Some("Exists"), None, Some("NoExecute")),
            &taint
        ));
        assert!(!tolerates(
            &toleration(Some("j"), Some("Exists"), None, None),
            &taint
        ));
    }

    fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    /// One shared GPU (80Gi, policy default 10Gi) on node-a and its class.
    fn shared_gpu() -> crate::Allocator {
        let slice = from_json(json!({
            "metadata": { "name": "node-a" },
            "spec": {
                "driver": "gpu.example.com", "nodeName": "node-a",
                "pool": { "name": "node-a", "generation": 1, "resourceSliceCount": 1 },
                "devices": [{
                    "name": "gpu-0",
                    "allowMultipleAllocations": true,
                    "capacity": { "memory": { "value": "80Gi", "requestPolicy": {
                        "default": "10Gi", "validRange": { "min": "5Gi", "step": "5Gi" } } } },
                }],
            },
        }));
        let class = from_json(json!({
            "metadata": { "name": "gpu" },
            "spec": { "selectors": [{ "cel": { "expression": "device.driver == 'gpu.example.com'" } }] },
        }));
        crate::Allocator::new(&[slice], &[class], &[])
    }

    fn gpu_requests(requests: Value) -> k8s_openapi::api::resource::v1::ResourceClaim {
        from_json(json!({
            "metadata": { "name": "c1", "namespace": "default" },
            "spec": { "devices": { "requests": requests } },
        }))
    }

    // Recorded (scenario 41): kube-scheduler leaves `count: 2` of a single shared device pending.
    #[test]
    fn one_request_takes_a_shared_device_once() {
        let claim = gpu_requests(json!([
            { "name": "gpu", "exactly": { "deviceClassName": "gpu", "count": 2 } },
        ]));
        let error = shared_gpu().allocate(&claim, "node-a").unwrap_err();
        assert!(
            matches!(error, AllocationError::Unsatisfiable { .. }),
            "{error}"
        );

        // Two requests of one claim may still share it.
        let claim = gpu_requests(json!([
            { "name": "a", "exactly": { "deviceClassName": "gpu" } },
            { "name": "b", "exactly": { "deviceClassName": "gpu" } },
        ]));
        let allocation = shared_gpu().allocate(&claim, "node-a").unwrap();
        assert_eq!(
            allocation
                .devices
                .unwrap()
                .results
                .unwrap_or_default()
                .len(),
            2
        );
    }

    // Recorded (every scenario without configs): the scheduler writes no `config` key then.
    #[test]
    fn no_config_key_without_configs() {
        let claim =
            gpu_requests(json!([{ "name": "gpu", "exactly": { "deviceClassName": "gpu" } }]));
        let allocation = shared_gpu().allocate(&claim, "node-a").unwrap();
        let value = serde_json::to_value(&allocation).unwrap();
        assert!(value["devices"].get("config").is_none(), "{value}");
    }
}

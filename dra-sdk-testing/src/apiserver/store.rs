//! The object store: JSON objects keyed by (group, resource, namespace, name), one global
//! resourceVersion counter, and the event history that watches replay from.
//!
//! Every write goes through the same pipeline the real server's generic registry uses:
//! decode, check type and name, apply the kind's strategy (status handling, immutable fields,
//! generation), run write hooks (the feature-gate emulation), validate, detect no-ops, commit.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

use super::object::{
    FieldError, Obj, apply_patch, generated_suffix, is_dns_subdomain, lookup, merge_patch, new_uid,
    now_timestamp, with_type_meta,
};
use super::resources::{ResourceType, StatusMode};
use super::selectors::Filter;
use super::status::ApiError;

/// Where an object lives. Objects are stored per group and resource, not per version.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjectKey {
    pub(crate) group: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl ObjectKey {
    fn new(rt: &ResourceType, namespace: Option<&str>, name: &str) -> Self {
        Self {
            group: rt.group,
            plural: rt.plural,
            namespace: if rt.namespaced {
                namespace.unwrap_or_default().to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    pub(crate) fn is_resource(&self, rt: &ResourceType) -> bool {
        self.group == rt.group && self.plural == rt.plural
    }
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed change, kept in the history for watches and point-in-time lists.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) rv: u64,
    pub(crate) key: ObjectKey,
    pub(crate) kind: EventType,
    /// The object after the change; for a deletion its last state, stamped with the deletion's
    /// resourceVersion.
    pub(crate) object: Arc<Value>,
    /// The object before the change (modifications and deletions).
    pub(crate) prev: Option<Arc<Value>>,
}

/// A write hook: mutates an object (without `apiVersion`/`kind`) before validation and storage.
pub(crate) type WriteHook = Arc<dyn Fn(&mut Value) + Send + Sync>;

/// Per-request inputs of a write.
pub(crate) struct WriteCtx<'a> {
    pub(crate) rt: &'a ResourceType,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) dry_run: bool,
    /// Hooks registered for this resource.
    pub(crate) hooks: &'a [WriteHook],
}

/// The body of a PATCH, by content type.
pub(crate) enum PatchBody {
    /// `application/merge-patch+json` and `application/strategic-merge-patch+json`.
    Merge(Value),
    /// `application/json-patch+json`.
    Json(json_patch::Patch),
    /// `application/apply-patch+yaml` (JSON bodies only).
    Apply { config: Value, manager: String },
}

/// DeleteOptions preconditions.
#[derive(Clone, Debug, Default)]
pub(crate) struct Preconditions {
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
}

/// Which state a list reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListAt {
    /// The current state (no `resourceVersion`, `0`, or `NotOlderThan`).
    Latest,
    /// The state right after this resourceVersion (`resourceVersionMatch=Exact`).
    Exact(u64),
}

/// The applied configuration with every list-map field of `rt` (`status.devices` of
/// ResourceClaims) replaced by its merged value: the stored entries of other managers kept, this
/// manager's entries from its previous apply dropped unless applied again, the applied entries
/// replacing stored ones with the same keys. The rest of the fake's apply replaces lists whole,
/// which would wipe other managers' entries; a real server merges these lists by key.
fn merge_list_maps(
    rt: &ResourceType,
    current: &Value,
    previous: Option<&Value>,
    config: &Value,
) -> Value {
    let mut merged = config.clone();
    for (path, keys) in rt.list_maps {
        let key_of = |item: &Value| -> Vec<Value> {
            keys.iter()
                .map(|k| item.get(*k).cloned().unwrap_or(Value::Null))
                .collect()
        };
        let list_at = |value: Option<&Value>| -> Vec<Value> {
            value
                .and_then(|v| lookup(v, path))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let applied = lookup(config, path).and_then(Value::as_array).cloned();
        let owned_before: Vec<Vec<Value>> = list_at(previous).iter().map(key_of).collect();
        if applied.is_none() && owned_before.is_empty() {
            continue;
        }
        let applied = applied.unwrap_or_default();
        let applied_keys: Vec<Vec<Value>> = applied.iter().map(key_of).collect();
        let mut result: Vec<Value> = list_at(Some(current))
            .into_iter()
            .filter(|item| {
                let key = key_of(item);
                !applied_keys.contains(&key) && !owned_before.contains(&key)
            })
            .collect();
        result.extend(applied);
        set_path(&mut merged, path, Value::Array(result));
    }
    merged
}

/// Sets the value at a dot-separated path, creating objects on the way.
fn set_path(value: &mut Value, path: &str, new: Value) {
    let mut current = value;
    let mut segments = path.split('.').peekable();
    while let Some(segment) = segments.next() {
        if !current.is_object() {
            *current = Value::Object(serde_json::Map::new());
        }
        let Value::Object(map) = current else {
            return;
        };
        if segments.peek().is_none() {
            map.insert(segment.to_owned(), new);
            return;
        }
        current = map.entry(segment.to_owned()).or_insert(Value::Null);
    }
}

/// Fields a client cannot set on create and cannot change on update.
const SYSTEM_FIELDS: [&str; 6] = [
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "resourceVersion",
];

pub(crate) struct State {
    objects: BTreeMap<ObjectKey, Arc<Value>>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// Events with a resourceVersion up to this one are gone from the history.
    compacted: u64,
    /// Last configuration each field manager applied, per object and per (manager, status?).
    applied: BTreeMap<ObjectKey, HashMap<(String, bool), Value>>,
    notify: watch::Sender<u64>,
}

impl State {
    pub(crate) fn new(history_limit: usize) -> Self {
        let rv = 1;
        let (notify, _) = watch::channel(rv);
        Self {
            objects: BTreeMap::new(),
            rv,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: rv,
            applied: BTreeMap::new(),
            notify,
        }
    }

    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    /// A receiver that wakes whenever the resourceVersion advances.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    pub(crate) fn get(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        self.objects
            .get(&ObjectKey::new(rt, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Current objects of a resource (in one namespace when the filter says so), in key order.
    fn current<'a>(
        &'a self,
        rt: &'a ResourceType,
        namespace: Option<&str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> {
        let namespace = namespace.filter(|_| rt.namespaced).map(str::to_string);
        let start = ObjectKey {
            group: rt.group,
            plural: rt.plural,
            namespace: namespace.clone().unwrap_or_default(),
            name: String::new(),
        };
        self.objects.range(start..).take_while(move |(key, _)| {
            key.is_resource(rt) && namespace.as_deref().is_none_or(|ns| key.namespace == ns)
        })
    }

    /// Lists matching objects and the resourceVersion the list reflects.
    pub(crate) fn list(
        &self,
        rt: &ResourceType,
        filter: &Filter,
        at: ListAt,
    ) -> Result<(Vec<Arc<Value>>, u64), ApiError> {
        match at {
            ListAt::Exact(rv) if rv != self.rv => {
                if rv < self.compacted {
                    return Err(self.expired(rv));
                }
                if rv > self.rv {
                    return Err(ApiError::new(
                        504,
                        "Timeout",
                        format!("Too large resource version: {rv}, current: {}", self.rv),
                    ));
                }
                // Roll the current state back through the history to `rv`.
                let mut state: BTreeMap<&ObjectKey, Arc<Value>> = self
                    .current(rt, None)
                    .map(|(k, v)| (k, v.clone()))
                    .collect();
                for event in self.history.iter().rev().take_while(|e| e.rv > rv) {
                    if !event.key.is_resource(rt) {
                        continue;
                    }
                    match (&event.kind, &event.prev) {
                        (EventType::Added, _) => {
                            state.remove(&event.key);
                        }
                        (_, Some(prev)) => {
                            state.insert(&event.key, prev.clone());
                        }
                        (_, None) => {}
                    }
                }
                let items = state
                    .into_values()
                    .filter(|obj| filter.matches(obj))
                    .collect();
                Ok((items, rv))
            }
            _ => Ok((
                self.current(rt, filter.namespace.as_deref())
                    .map(|(_, v)| v.clone())
                    .filter(|o| filter.matches(o))
                    .collect(),
                self.rv,
            )),
        }
    }

    /// The 410 a list or watch gets for a resourceVersion older than the kept history.
    pub(crate) fn expired(&self, rv: u64) -> ApiError {
        ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({})", self.compacted),
        )
    }

    /// Events after `cursor` and the current resourceVersion, or `Err` with the compaction point
    /// when the history no longer reaches back to `cursor`.
    pub(crate) fn events_after(&self, cursor: u64) -> Result<(Vec<Arc<Event>>, u64), ApiError> {
        if cursor < self.compacted {
            return Err(self.expired(cursor));
        }
        let start = self.history.partition_point(|e| e.rv <= cursor);
        Ok((self.history.range(start..).cloned().collect(), self.rv))
    }

    pub(crate) fn create(
        &mut self,
        ctx: &WriteCtx<'_>,
        body: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let rt = ctx.rt;
        let mut obj = Obj::from_value(body).map_err(|m| decode_error(rt, &m))?;
        check_type(rt, &obj)?;
        if rt.namespaced {
            let namespace = ctx.namespace.unwrap_or_default();
            if obj.meta_str("namespace").is_some_and(|ns| ns != namespace) {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            obj.set_meta("namespace", namespace);
        } else {
            obj.meta.remove("namespace");
        }
        if obj.resource_version().is_some() {
            // The real server fails this deep in storage, hence the odd reasonless 500.
            return Err(ApiError::unclassified(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let name = match (obj.name(), obj.meta_str("generateName")) {
            (Some(name), _) => name.to_string(),
            (None, Some(prefix)) => self.generate_name(rt, ctx.namespace, prefix),
            (None, None) => {
                return Err(ApiError::invalid(
                    rt,
                    "",
                    &[FieldError {
                        field: "metadata.name".into(),
                        reason: "FieldValueRequired",
                        message: "Required value: name or generateName is required".into(),
                    }],
                ));
            }
        };
        if !is_dns_subdomain(&name) {
            return Err(ApiError::invalid(
                rt,
                &name,
                &[FieldError::invalid(
                    "metadata.name",
                    &Value::from(name.as_str()),
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                )],
            ));
        }
        obj.set_meta("name", name.as_str());
        for field in SYSTEM_FIELDS.iter().chain(&["selfLink", "managedFields"]) {
            obj.meta.remove(*field);
        }
        obj.set_meta("uid", new_uid());
        obj.set_meta("creationTimestamp", now_timestamp());
        if rt.generation {
            obj.set_meta("generation", 1);
        }
        if rt.status
            == (StatusMode::Subresource {
                clear_on_create: true,
            })
        {
            obj.body.remove("status");
        }
        let obj = admit(ctx, obj, &name)?;
        let key = ObjectKey::new(rt, ctx.namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(rt, &name));
        }
        Ok(self.commit(ctx, key, obj, None))
    }

    fn generate_name(&self, rt: &ResourceType, namespace: Option<&str>, prefix: &str) -> String {
        // Same cap as the Go name generator: the prefix keeps at most 58 characters.
        let prefix: String = prefix.chars().take(58).collect();
        let mut name = format!("{prefix}{}", generated_suffix());
        for _ in 0..16 {
            if !self
                .objects
                .contains_key(&ObjectKey::new(rt, namespace, &name))
            {
                break;
            }
            name = format!("{prefix}{}", generated_suffix());
        }
        name
    }

    /// PUT, on the object (`status == false`) or its `/status` subresource.
    pub(crate) fn replace(
        &mut self,
        ctx: &WriteCtx<'_>,
        name: &str,
        body: Value,
        status: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let key = ObjectKey::new(ctx.rt, ctx.namespace, name);
        let current = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(ctx.rt, name))?;
        let candidate = Obj::from_value(body).map_err(|m| decode_error(ctx.rt, &m))?;
        self.update(ctx, key, current, candidate, status)
    }

    /// PATCH; apply patches create the object when it does not exist (second value `true`).
    pub(crate) fn patch(
        &mut self,
        ctx: &WriteCtx<'_>,
        name: &str,
        patch: PatchBody,
        status: bool,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let rt = ctx.rt;
        let key = ObjectKey::new(rt, ctx.namespace, name);
        let Some(current) = self.objects.get(&key).cloned() else {
            return match patch {
                PatchBody::Apply { config, manager } if !status => {
                    let created = self.create_applied(ctx, name, config.clone())?;
                    if !ctx.dry_run {
                        self.applied
                            .entry(key)
                            .or_default()
                            .insert((manager, status), config);
                    }
                    Ok((created, true))
                }
                _ => Err(ApiError::not_found(rt, name)),
            };
        };
        let mut doc = with_type_meta(&current, &rt.api_version(), rt.kind);
        let mut remember = None;
        match patch {
            PatchBody::Merge(patch) => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                merge_patch(&mut doc, &patch);
            }
            PatchBody::Json(ops) => json_patch::patch(&mut doc, &ops).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the JSON patch could not be applied: {e}"),
                )
            })?,
            PatchBody::Apply { config, manager } => {
                if let Some(uid) = lookup(&config, "metadata.uid").and_then(Value::as_str)
                    && Some(uid)
                        != current
                            .get("metadata")
                            .and_then(|m| m.get("uid"))
                            .and_then(Value::as_str)
                {
                    return Err(ApiError::new(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {uid}",
                            rt.qualified_resource()
                        ),
                    ));
                }
                let previous = self
                    .applied
                    .get(&key)
                    .and_then(|m| m.get(&(manager.clone(), status)));
                let merged = merge_list_maps(rt, &doc, previous, &config);
                merge_patch(&mut doc, &apply_patch(previous, &merged));
                remember = Some((manager, config));
            }
        }
        let candidate = Obj::from_value(doc).map_err(|m| decode_error(rt, &m))?;
        let result = self.update(ctx, key.clone(), current, candidate, status)?;
        if let (Some((manager, config)), false) = (remember, ctx.dry_run) {
            self.applied
                .entry(key)
                .or_default()
                .insert((manager, status), config);
        }
        Ok((result, false))
    }

    fn create_applied(
        &mut self,
        ctx: &WriteCtx<'_>,
        name: &str,
        mut config: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let obj = Obj::from_value(config.clone()).map_err(|m| decode_error(ctx.rt, &m))?;
        if obj.api_version.is_none() || obj.kind.is_none() {
            return Err(ApiError::bad_request(
                "apiVersion and kind must be set in an apply patch",
            ));
        }
        match obj.name() {
            Some(body_name) if body_name != name => return Err(name_mismatch(body_name, name)),
            Some(_) => {}
            None => merge_patch(
                &mut config,
                &serde_json::json!({"metadata": {"name": name}}),
            ),
        }
        self.create(ctx, config)
    }

    /// The shared update path of PUT and PATCH: `candidate` is the full desired object.
    fn update(
        &mut self,
        ctx: &WriteCtx<'_>,
        key: ObjectKey,
        current: Arc<Value>,
        mut candidate: Obj,
        status: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let rt = ctx.rt;
        let name = key.name.clone();
        check_type(rt, &candidate)?;
        if candidate.name() != Some(name.as_str()) {
            return Err(name_mismatch(candidate.name().unwrap_or_default(), &name));
        }
        if rt.namespaced
            && candidate
                .meta_str("namespace")
                .is_some_and(|ns| ns != key.namespace)
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let stored = Obj::from_value((*current).clone()).map_err(ApiError::internal)?;
        if candidate
            .resource_version()
            .is_some_and(|rv| Some(rv) != stored.resource_version())
        {
            return Err(ApiError::stale(rt, &name));
        }
        let mut next = if status {
            // Status writes change `status` only; metadata and spec stay as stored.
            let mut next = stored.clone();
            next.copy_field_from(&candidate, "status");
            next
        } else {
            if rt.has_status_subresource() {
                candidate.copy_field_from(&stored, "status");
            }
            for field in SYSTEM_FIELDS
                .iter()
                .chain(&["namespace", "selfLink", "managedFields"])
            {
                candidate.copy_meta_from(&stored, field);
            }
            let errors: Vec<FieldError> = rt
                .immutable
                .iter()
                .filter(|path| obj_lookup(&stored, path) != obj_lookup(&candidate, path))
                .map(|path| {
                    FieldError::immutable(
                        path,
                        obj_lookup(&candidate, path).unwrap_or(&Value::Null),
                    )
                })
                .collect();
            if !errors.is_empty() {
                return Err(ApiError::invalid(rt, &name, &errors));
            }
            candidate.api_version = None;
            candidate.kind = None;
            candidate
        };
        next = admit(ctx, next, &name)?;
        if rt.generation && !status && next.body.get("spec") != stored.body.get("spec") {
            next.set_meta("generation", generation(&stored) + 1);
        }
        if next == stored {
            // Like etcd3's GuaranteedUpdate: an unchanged object is not written, keeps its
            // resourceVersion and produces no event.
            return Ok(current);
        }
        if stored.meta_str("deletionTimestamp").is_some() && next.finalizers_empty() {
            return Ok(self.commit_removal(ctx, key, next, current));
        }
        Ok(self.commit(ctx, key, next, Some(current)))
    }

    /// DELETE; returns the object and whether it is gone (`false`: finalizers keep it, now
    /// marked with a deletionTimestamp).
    pub(crate) fn delete(
        &mut self,
        ctx: &WriteCtx<'_>,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let rt = ctx.rt;
        let key = ObjectKey::new(rt, ctx.namespace, name);
        let current = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        let stored = Obj::from_value((*current).clone()).map_err(ApiError::internal)?;
        if let Some(uid) = preconditions.uid.as_deref()
            && Some(uid) != stored.meta_str("uid")
        {
            let detail = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                stored.meta_str("uid").unwrap_or_default()
            );
            return Err(ApiError::conflict(rt, name, &detail));
        }
        if let Some(rv) = preconditions.resource_version.as_deref()
            && Some(rv) != stored.resource_version()
        {
            let detail = format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                stored.resource_version().unwrap_or_default()
            );
            return Err(ApiError::conflict(rt, name, &detail));
        }
        if !stored.finalizers_empty() {
            if stored.meta_str("deletionTimestamp").is_some() {
                return Ok((current, false));
            }
            let mut next = stored.clone();
            next.set_meta("deletionTimestamp", now_timestamp());
            next.set_meta("deletionGracePeriodSeconds", 0);
            if rt.generation {
                next.set_meta("generation", generation(&stored) + 1);
            }
            return Ok((self.commit(ctx, key, next, Some(current)), false));
        }
        Ok((self.commit_removal(ctx, key, stored, current), true))
    }

    /// DELETE on a collection: deletes every match, returns what it deleted (or marked).
    pub(crate) fn delete_collection(
        &mut self,
        ctx: &WriteCtx<'_>,
        filter: &Filter,
    ) -> Result<Vec<Arc<Value>>, ApiError> {
        let targets: Vec<ObjectKey> = self
            .current(ctx.rt, filter.namespace.as_deref())
            .filter(|(_, obj)| filter.matches(obj))
            .map(|(k, _)| k.clone())
            .collect();
        let mut deleted = Vec::with_capacity(targets.len());
        for key in targets {
            let ctx = WriteCtx {
                namespace: Some(&key.namespace),
                ..*ctx
            };
            deleted.push(self.delete(&ctx, &key.name, &Preconditions::default())?.0);
        }
        Ok(deleted)
    }

    fn commit(
        &mut self,
        ctx: &WriteCtx<'_>,
        key: ObjectKey,
        mut obj: Obj,
        prev: Option<Arc<Value>>,
    ) -> Arc<Value> {
        if ctx.dry_run {
            return Arc::new(obj.into_value());
        }
        self.rv += 1;
        obj.set_meta("resourceVersion", self.rv.to_string());
        let value = Arc::new(obj.into_value());
        self.objects.insert(key.clone(), value.clone());
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(key, kind, value.clone(), prev);
        value
    }

    fn commit_removal(
        &mut self,
        ctx: &WriteCtx<'_>,
        key: ObjectKey,
        mut last: Obj,
        prev: Arc<Value>,
    ) -> Arc<Value> {
        if ctx.dry_run {
            return Arc::new(last.into_value());
        }
        self.rv += 1;
        last.set_meta("resourceVersion", self.rv.to_string());
        let value = Arc::new(last.into_value());
        self.objects.remove(&key);
        self.applied.remove(&key);
        self.record(key, EventType::Deleted, value.clone(), Some(prev));
        value
    }

    fn record(
        &mut self,
        key: ObjectKey,
        kind: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        self.history.push_back(Arc::new(Event {
            rv: self.rv,
            key,
            kind,
            object,
            prev,
        }));
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.rv;
            }
        }
        self.notify.send_replace(self.rv);
    }
}

/// Write hooks, then the kind's validation.
fn admit(ctx: &WriteCtx<'_>, obj: Obj, name: &str) -> Result<Obj, ApiError> {
    if ctx.hooks.is_empty() && ctx.rt.validate.is_none() {
        return Ok(obj);
    }
    let mut value = obj.into_value();
    for hook in ctx.hooks {
        hook(&mut value);
    }
    if let Some(validate) = ctx.rt.validate {
        let errors = validate(&value);
        if !errors.is_empty() {
            return Err(ApiError::invalid(ctx.rt, name, &errors));
        }
    }
    Obj::from_value(value)
        .map_err(|m| ApiError::internal(format!("a write hook left an invalid object: {m}")))
}

fn check_type(rt: &ResourceType, obj: &Obj) -> Result<(), ApiError> {
    let api_version = rt.api_version();
    if let Some(kind) = obj.kind.as_deref()
        && kind != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({api_version}) or the kind {kind} does not match {}",
            obj.api_version.as_deref().unwrap_or_default(),
            rt.kind
        )));
    }
    if let Some(version) = obj.api_version.as_deref()
        && version != api_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({version}) does not match the expected API version ({api_version})"
        )));
    }
    Ok(())
}

fn decode_error(rt: &ResourceType, message: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the body of the request could not be decoded as a {}: {message}",
        rt.kind
    ))
}

fn name_mismatch(body_name: &str, url_name: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the name of the object ({body_name}) does not match the name on the URL ({url_name})"
    ))
}

fn generation(obj: &Obj) -> i64 {
    obj.meta
        .get("generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// `lookup` on a split object: `metadata.*` in the metadata, everything else in the body.
fn obj_lookup<'a>(obj: &'a Obj, path: &str) -> Option<&'a Value> {
    match path.split_once('.') {
        Some(("metadata", rest)) => lookup_map(&obj.meta, rest),
        _ => lookup_map(&obj.body, path),
    }
}

fn lookup_map<'a>(map: &'a serde_json::Map<String, Value>, path: &str) -> Option<&'a Value> {
    let (first, rest) = path.split_once('.').unwrap_or((path, ""));
    let top = map.get(first)?;
    if rest.is_empty() {
        Some(top)
    } else {
        lookup(top, rest)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ctx(rt: &ResourceType) -> WriteCtx<'_> {
        WriteCtx {
            rt,
            namespace: Some("default"),
            dry_run: false,
            hooks: &[],
        }
    }

    fn slice(name: &str, node: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
        })
    }

    #[test]
    fn create_assigns_metadata_and_history() {
        let rt = ResourceType::RESOURCE_SLICES;
        let mut state = State::new(100);
        let obj = state.create(&ctx(&rt), slice("s1", "n1")).unwrap();
        assert_eq!(obj["metadata"]["resourceVersion"], "2");
        assert_eq!(obj["metadata"]["generation"], 1);
        assert!(
            obj.get("apiVersion").is_none(),
            "type meta is stamped per response"
        );
        assert_eq!(state.events_after(1).unwrap().0.len(), 1);
        let err = state.create(&ctx(&rt), slice("s1", "n1")).unwrap_err();
        assert_eq!((err.code, err.reason), (409, "AlreadyExists"));
    }

    #[test]
    fn noop_update_keeps_resource_version() {
        let rt = ResourceType::RESOURCE_SLICES;
        let mut state = State::new(100);
        let created = state.create(&ctx(&rt), slice("s1", "n1")).unwrap();
        let again = state
            .replace(
                &ctx(&rt),
                "s1",
                with_type_meta(&created, "resource.k8s.io/v1", "ResourceSlice"),
                false,
            )
            .unwrap();
        assert!(Arc::ptr_eq(&created, &again));
        assert_eq!(state.resource_version(), 2);
    }

    #[test]
    fn immutable_fields_and_generation() {
        let rt = ResourceType::RESOURCE_SLICES;
        let mut state = State::new(100);
        state.create(&ctx(&rt), slice("s1", "n1")).unwrap();
        let err = state
            .patch(
                &ctx(&rt),
                "s1",
                PatchBody::Merge(json!({"spec": {"nodeName": "n2"}})),
                false,
            )
            .unwrap_err();
        assert_eq!((err.code, err.reason), (422, "Invalid"));
        let (patched, _) = state
            .patch(
                &ctx(&rt),
                "s1",
                PatchBody::Merge(json!({"spec": {"pool": {"generation": 2}}})),
                false,
            )
            .unwrap();
        assert_eq!(patched["metadata"]["generation"], 2);
        let (labelled, _) = state
            .patch(
                &ctx(&rt),
                "s1",
                PatchBody::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
                false,
            )
            .unwrap();
        assert_eq!(
            labelled["metadata"]["generation"], 2,
            "metadata changes keep the generation"
        );
    }

    #[test]
    fn exact_list_rolls_back_history() {
        let rt = ResourceType::RESOURCE_SLICES;
        let mut state = State::new(100);
        state.create(&ctx(&rt), slice("a", "n1")).unwrap();
        let rv = state.resource_version();
        state.create(&ctx(&rt), slice("b", "n1")).unwrap();
        state
            .delete(&ctx(&rt), "a", &Preconditions::default())
            .unwrap();
        let (now, _) = state.list(&rt, &Filter::default(), ListAt::Latest).unwrap();
        assert_eq!(now.len(), 1);
        let (then, at) = state
            .list(&rt, &Filter::default(), ListAt::Exact(rv))
            .unwrap();
        assert_eq!(at, rv);
        assert_eq!(then.len(), 1);
        assert_eq!(then[0]["metadata"]["name"], "a");
        assert_eq!(
            state
                .list(&rt, &Filter::default(), ListAt::Exact(0))
                .unwrap_err()
                .code,
            410
        );
    }

    #[test]
    fn history_compacts() {
        let rt = ResourceType::RESOURCE_SLICES;
        let mut state = State::new(2);
        for name in ["a", "b", "c", "d"] {
            state.create(&ctx(&rt), slice(name, "n1")).unwrap();
        }
        assert_eq!(state.events_after(1).unwrap_err().code, 410);
        assert_eq!(state.events_after(3).unwrap().0.len(), 2);
    }

    #[test]
    fn finalizers_defer_deletion() {
        let rt = ResourceType::RESOURCE_CLAIMS;
        let mut state = State::new(100);
        let claim = json!({"metadata": {"name": "c", "finalizers": ["x"]}, "spec": {}});
        state.create(&ctx(&rt), claim).unwrap();
        let (marked, gone) = state
            .delete(&ctx(&rt), "c", &Preconditions::default())
            .unwrap();
        assert!(!gone);
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        state
            .patch(
                &ctx(&rt),
                "c",
                PatchBody::Merge(json!({"metadata": {"finalizers": null}})),
                false,
            )
            .unwrap();
        assert_eq!(state.get(&rt, Some("default"), "c").unwrap_err().code, 404);
    }

    #[test]
    fn apply_removes_fields_the_manager_dropped() {
        let rt = ResourceType::DEVICE_CLASSES;
        let mut state = State::new(100);
        let apply = |labels: Value| PatchBody::Apply {
            config: json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                           "metadata": {"name": "gpu", "labels": labels}, "spec": {}}),
            manager: "m".into(),
        };
        let (_, created) = state
            .patch(&ctx(&rt), "gpu", apply(json!({"a": "1", "b": "2"})), false)
            .unwrap();
        assert!(created);
        let (obj, created) = state
            .patch(&ctx(&rt), "gpu", apply(json!({"a": "1"})), false)
            .unwrap();
        assert!(!created);
        assert_eq!(obj["metadata"]["labels"], json!({"a": "1"}));
    }
}

//! The publisher's view of its slices: the watch plus its own acknowledged writes.

use super::*;

/// Whether resource version `a` is newer than `b`. Resource versions are opaque, but every
/// API server uses integers; anything else counts as newer when different.
pub(super) fn newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => a != b,
    }
}

pub(super) fn rv(slice: &api::ResourceSlice) -> &str {
    slice
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default()
}

/// An acknowledged write that the watch has not shown yet.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Pending {
    Written(String),
    Deleted,
}

/// What a watch event meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// Nothing new (stale, or our own write echoed).
    Nothing,
    /// Someone else changed a slice.
    Foreign,
    /// The initial list is complete.
    Ready,
}

/// The publisher's view of its slices: the watch plus its own acknowledged writes.
#[derive(Debug, Default)]
pub(super) struct SliceCache {
    pub(super) objects: BTreeMap<String, api::ResourceSlice>,
    pub(super) ready: bool,
    pub(super) relist: Option<BTreeMap<String, api::ResourceSlice>>,
    pub(super) pending: BTreeMap<String, Pending>,
    /// Resource versions of slices we deleted, to ignore late events about them.
    pub(super) tombstones: BTreeMap<String, String>,
}

impl SliceCache {
    pub(super) fn apply(&mut self, event: watcher::Event<api::ResourceSlice>) -> Seen {
        match event {
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                Seen::Nothing
            }
            watcher::Event::InitApply(slice) => {
                if let (Some(relist), Some(name)) = (&mut self.relist, slice.metadata.name.clone())
                {
                    relist.insert(name, slice);
                }
                Seen::Nothing
            }
            watcher::Event::InitDone => self.finish_relist(),
            watcher::Event::Apply(slice) => self.applied(slice),
            watcher::Event::Delete(slice) => self.deleted(&slice),
        }
    }

    pub(super) fn finish_relist(&mut self) -> Seen {
        let listed = self.relist.take().unwrap_or_default();
        let mut foreign = false;
        let names: BTreeSet<String> = listed.keys().chain(self.objects.keys()).cloned().collect();
        let mut objects = BTreeMap::new();
        for name in names {
            match (listed.get(&name), self.objects.get(&name)) {
                (Some(listed), Some(cached)) if newer(rv(cached), rv(listed)) => {
                    // Our own write raced the list; the watch will confirm it.
                    objects.insert(name, cached.clone());
                }
                (Some(listed), cached) => {
                    foreign |= cached.is_none_or(|c| rv(c) != rv(listed));
                    if let Some(Pending::Written(pending)) = self.pending.get(&name)
                        && !newer(pending, rv(listed))
                    {
                        self.pending.remove(&name);
                    }
                    objects.insert(name, listed.clone());
                }
                (None, _) => {
                    foreign = true;
                    if self.pending.get(&name) == Some(&Pending::Deleted) {
                        self.pending.remove(&name);
                    }
                }
            }
        }
        self.objects = objects;
        self.tombstones.clear();
        if !self.ready {
            self.ready = true;
            Seen::Ready
        } else if foreign {
            Seen::Foreign
        } else {
            Seen::Nothing
        }
    }

    pub(super) fn applied(&mut self, slice: api::ResourceSlice) -> Seen {
        let Some(name) = slice.metadata.name.clone() else {
            return Seen::Nothing;
        };
        let version = rv(&slice).to_owned();
        if let Some(Pending::Written(pending)) = self.pending.get(&name)
            && !newer(pending, &version)
        {
            self.pending.remove(&name);
        }
        let stale = self
            .objects
            .get(&name)
            .map(|cached| !newer(&version, rv(cached)))
            .or_else(|| self.tombstones.get(&name).map(|t| !newer(&version, t)))
            .unwrap_or(false);
        if stale {
            return Seen::Nothing;
        }
        self.tombstones.remove(&name);
        self.objects.insert(name, slice);
        Seen::Foreign
    }

    pub(super) fn deleted(&mut self, slice: &api::ResourceSlice) -> Seen {
        let Some(name) = slice.metadata.name.as_deref() else {
            return Seen::Nothing;
        };
        if self.pending.get(name) == Some(&Pending::Deleted) {
            self.pending.remove(name);
        }
        match self.objects.get(name) {
            Some(cached) if !newer(rv(cached), rv(slice)) => {
                self.objects.remove(name);
                Seen::Foreign
            }
            _ => Seen::Nothing,
        }
    }

    pub(super) fn wrote(&mut self, slice: api::ResourceSlice) {
        if let Some(name) = slice.metadata.name.clone() {
            // A write that changed nothing keeps the resource version and produces no watch
            // event; waiting for its echo would never end.
            let changed = self
                .objects
                .get(&name)
                .is_none_or(|cached| newer(rv(&slice), rv(cached)));
            if changed {
                self.pending
                    .insert(name.clone(), Pending::Written(rv(&slice).to_owned()));
            }
            self.tombstones.remove(&name);
            self.objects.insert(name, slice);
        }
    }

    pub(super) fn removed(
        &mut self,
        name: &str,
        last_version: Option<String>,
        echo_expected: bool,
    ) {
        self.objects.remove(name);
        if echo_expected {
            self.pending.insert(name.to_owned(), Pending::Deleted);
        } else {
            self.pending.remove(name);
        }
        if let Some(version) = last_version {
            self.tombstones.insert(name.to_owned(), version);
        }
    }

    /// Replaces what we know about one slice with the server's current state.
    pub(super) fn refreshed(&mut self, name: &str, slice: Option<api::ResourceSlice>) {
        match slice {
            Some(slice) => {
                if let Some(Pending::Written(pending)) = self.pending.get(name)
                    && !newer(pending, rv(&slice))
                {
                    self.pending.remove(name);
                }
                self.objects.insert(name.to_owned(), slice);
            }
            None => {
                self.objects.remove(name);
                if self.pending.get(name) == Some(&Pending::Deleted) {
                    self.pending.remove(name);
                }
            }
        }
    }
}

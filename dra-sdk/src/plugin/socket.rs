//! Unix socket helpers: private binding, stale-socket removal and rolling-update names.

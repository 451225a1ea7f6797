//! Container Device Interface (CDI): typed specs, validation and per-claim spec files.

//! Derive macros for `dra-sdk`. Use them through the re-exports in `dra_sdk`.

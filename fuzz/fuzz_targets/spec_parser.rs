//! Fuzzes the CDI spec parser with arbitrary bytes (JSON, YAML or neither).
//!
//! Checks that parsing never panics, and that a document that parses and validates serializes
//! to JSON that parses and validates as the same spec.

#![no_main]

use dra_sdk::advanced::cdi::Spec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|document: &[u8]| {
    let Ok(spec) = Spec::parse(document) else {
        return;
    };
    let json = spec.to_json().expect("a valid spec serializes");
    let again = Spec::parse(&json).expect("the JSON of a valid spec parses and validates");
    assert_eq!(again, spec, "JSON round trip changed the spec");
});

//! Opaque device configuration: a registry of the driver's config types and strict decoding.

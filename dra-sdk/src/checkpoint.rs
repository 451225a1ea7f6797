//! Durable record of prepared claims: versioned, checksummed, boot-scoped.

//! The publisher's slice naming scheme: readable, unique, within the DNS-subdomain limit, and
//! parseable back into the slice index.

use sha2::{Digest, Sha256};

use crate::k8s::names::DNS_SUBDOMAIN_MAX;

/// Width of the zero-padded slice index at the end of a slice name.
const INDEX_WIDTH: usize = 4;
/// Hex digits of the scope hash in a slice name.
const HASH_HEX: usize = 8;

/// The name of slice `index` of a pool.
///
/// Layout: `<readable prefix>-<hash>-<index>`, where the prefix is `[<node>-]<driver>-<pool>`
/// (`/` in the pool name becomes `.`), truncated so the name stays within 253 characters, the
/// hash is the first 32 bits of SHA-256 over node, driver and pool (it keeps names unique when
/// the readable prefix is ambiguous or truncated), and the index is zero-padded to four
/// digits so that names sort in index order. The result is a valid DNS subdomain whenever the
/// inputs pass validation.
pub(crate) fn slice_name(node: Option<&str>, driver: &str, pool: &str, index: u32) -> String {
    let mut hasher = Sha256::new();
    hasher.update(node.unwrap_or_default());
    hasher.update([0]);
    hasher.update(driver);
    hasher.update([0]);
    hasher.update(pool);
    let digest = hasher.finalize();
    let hash: String = digest
        .iter()
        .take(HASH_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let suffix = format!("-{hash}-{index:0INDEX_WIDTH$}");

    let mut prefix = String::with_capacity(DNS_SUBDOMAIN_MAX);
    for part in node.into_iter().chain([driver, pool]) {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.extend(part.chars().map(|c| match c {
            '/' => '.',
            c => c.to_ascii_lowercase(),
        }));
    }
    let budget = DNS_SUBDOMAIN_MAX.saturating_sub(suffix.len());
    if prefix.len() > budget {
        // The prefix is ASCII after validation; cut on a char boundary regardless.
        let mut cut = budget;
        while !prefix.is_char_boundary(cut) {
            cut -= 1;
        }
        prefix.truncate(cut);
    }
    // A label must not end in '-' and the name must not contain an empty label.
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    prefix + &suffix
}

/// The slice index encoded in `name` if it is this pool's slice name for that index.
pub(crate) fn slice_index(name: &str, node: Option<&str>, driver: &str, pool: &str) -> Option<u32> {
    let (_, index) = name.rsplit_once('-')?;
    if index.len() < INDEX_WIDTH || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let index: u32 = index.parse().ok()?;
    (slice_name(node, driver, pool, index) == name).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::names::dns_subdomain;

    #[test]
    fn slice_names_are_valid_stable_and_parseable() {
        let name = slice_name(Some("node-1"), "gpu.example.com", "pool/a", 3);
        assert!(name.starts_with("node-1-gpu.example.com-pool.a-"));
        assert!(name.ends_with("-0003"));
        assert!(dns_subdomain(&name).is_ok(), "{name}");
        assert_eq!(
            name,
            slice_name(Some("node-1"), "gpu.example.com", "pool/a", 3)
        );
        assert_eq!(
            slice_index(&name, Some("node-1"), "gpu.example.com", "pool/a"),
            Some(3)
        );
        assert_eq!(
            slice_index(&name, Some("node-1"), "gpu.example.com", "pool.a"),
            None
        );
        // '/' and '.' spell the same prefix but hash differently.
        assert_ne!(
            slice_name(None, "d.io", "a/b", 0),
            slice_name(None, "d.io", "a.b", 0)
        );
        assert!(slice_name(None, "d.io", "p", 12345).ends_with("-12345"));
    }

    #[test]
    fn long_names_are_truncated_to_valid_subdomains() {
        let pool = format!("{}/{}", "a".repeat(120), "b".repeat(120));
        let node = "n".repeat(63);
        let name = slice_name(Some(&node), "gpu.example.com", &pool, 0);
        assert!(name.len() <= DNS_SUBDOMAIN_MAX);
        assert!(dns_subdomain(&name).is_ok(), "{name}");
        assert_eq!(
            slice_index(&name, Some(&node), "gpu.example.com", &pool),
            Some(0)
        );
        // Truncation right after a separator must not leave "-" or "." before the suffix.
        for cut in 0..20 {
            let pool = format!("{}.b", "a".repeat(160 + cut));
            let name = slice_name(Some(&node), "gpu.example.com", &pool, 7);
            assert!(dns_subdomain(&name).is_ok(), "{name}");
        }
    }
}

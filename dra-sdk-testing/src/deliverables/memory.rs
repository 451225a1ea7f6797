//! Resident memory of a process, read from `/proc`: what the start-up benches of the drivers
//! report.

/// `VmRSS`, `RssAnon` and `RssFile` of a process, in KiB.
pub fn rss_kib(pid: u32) -> Option<[u64; 3]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
    };
    Some([field("VmRSS:")?, field("RssAnon:")?, field("RssFile:")?])
}

/// Resident KiB per mapped file (`[heap]`, `[stack]`, or `anonymous` for the rest), largest
/// first: where the resident memory goes.
pub fn rss_by_mapping(pid: u32) -> Vec<(String, u64)> {
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return Vec::new();
    };
    let mut by_name = std::collections::BTreeMap::<String, u64>::new();
    let mut current = String::new();
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields
            .first()
            .is_some_and(|range| range.contains('-') && !range.ends_with(':'))
        {
            current = fields
                .get(5)
                .map_or("anonymous", |name| name.rsplit('/').next().unwrap_or(name))
                .to_owned();
        } else if let Some(kib) = line.strip_prefix("Rss:") {
            let kib: u64 = kib
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap_or(0);
            *by_name.entry(current.clone()).or_default() += kib;
        }
    }
    let mut sorted: Vec<_> = by_name.into_iter().filter(|(_, kib)| *kib > 0).collect();
    sorted.sort_by_key(|(_, kib)| std::cmp::Reverse(*kib));
    sorted
}

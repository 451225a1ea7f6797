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

/// KiB in MiB, for printing.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Prints what a start-up bench measured over several starts of a plugin: the time from
/// process start to its first ResourceSlice, and its idle resident memory ([`rss_kib`] of each
/// run), each as median, min and max. `what` opens both lines (plugin and setting), `devices`
/// says what was published (`8 devices`), `file_backed` what the file-backed memory holds
/// (`the executable`).
pub fn print_startup(
    what: &str,
    devices: &str,
    file_backed: &str,
    mut startups: Vec<std::time::Duration>,
    mut rss: Vec<[u64; 3]>,
) {
    startups.sort();
    rss.sort_by_key(|[total, ..]| *total);
    println!(
        "{what}: process start to first ResourceSlice: median {:?} (min {:?}, max {:?})",
        startups[startups.len() / 2],
        startups[0],
        startups[startups.len() - 1]
    );
    let [total, anon, file] = rss[rss.len() / 2];
    println!(
        "{what}: idle resident memory with {devices}: median {:.1} MiB (min {:.1}, max {:.1}); \
         of the median, {:.1} MiB anonymous (heap, stacks), {:.1} MiB file-backed \
         ({file_backed})",
        mib(total),
        mib(rss[0][0]),
        mib(rss[rss.len() - 1][0]),
        mib(anon),
        mib(file),
    );
}

/// Prints the six largest entries of [`rss_by_mapping`] of a plugin's last run, in MiB.
pub fn print_mappings(mappings: &[(String, u64)]) {
    let top: Vec<String> = mappings
        .iter()
        .take(6)
        .map(|(name, kib)| format!("{name} {:.1}", mib(*kib)))
        .collect();
    println!("resident MiB by mapping (last run): {}", top.join(", "));
}

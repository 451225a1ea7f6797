//! The dynamic loader's cache, `/etc/ld.so.cache` of a driver root, read the way
//! `nvidia-ctk` reads it: to find driver libraries in folders that are not among the usual
//! library folders (`/usr/lib64/nvidia`, `/opt/...`, listed in `/etc/ld.so.conf.d`).
//!
//! The file is glibc's: optionally the old format (`ld.so-1.7.0`, from before glibc 2.2),
//! then the new one (`glibc-ld.so.cache` version `1.1`): a 48-byte header with the number of
//! entries, then 24-byte entries (flags, offsets of the library's name and path in the string
//! table, OS version, hardware capabilities). Offsets count from the new header's start.
//! Only 64-bit ELF entries are kept (x86-64, ppc64le and aarch64 flags), as `nvidia-ctk`
//! keeps only 64-bit libraries; `nvidia-ctk` also skips aarch64 entries, which this reader
//! does not, so that an Arm node's cache is usable.
//!
//! Parsing never panics on a malformed file: a bad header is [`LdCacheError`], an entry whose
//! offsets fall outside the file is skipped.

/// Where the cache is, relative to the root it describes.
pub const LD_SO_CACHE: &str = "/etc/ld.so.cache";

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0\0";
const OLD_HEADER_LEN: usize = 16; // magic (12) + number of entries (4)
const OLD_ENTRY_LEN: usize = 12; // flags, key, value: 3 × 4
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const NEW_HEADER_LEN: usize = 48;
const NEW_ENTRY_LEN: usize = 24;

const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_ELF: i32 = 0x0001;
const FLAG_ARCH_MASK: i32 = 0xff00;
/// x86-64, ppc64le and aarch64 (`FLAG_X8664_LIB64`, `FLAG_POWERPC_LIB64`,
/// `FLAG_AARCH64_LIB64` in glibc's `ldconfig.h`).
const FLAGS_64_BIT: [i32; 3] = [0x0300, 0x0500, 0x0a00];

/// Why the cache could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum LdCacheError {
    /// The file is not a glibc loader cache of a known format.
    #[error("not a glibc ld.so.cache (format 1.1): {reason}")]
    Format {
        /// What is wrong.
        reason: &'static str,
    },
}

/// One 64-bit library of the cache: the name the loader looks up (the soname,
/// `libcuda.so.1`) and the path it loads (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LdCacheEntry {
    /// The library name.
    pub name: String,
    /// Its path, as the loader sees it on the root the cache belongs to.
    pub path: String,
}

/// The 64-bit entries of a cache file, in the file's order.
pub fn parse(data: &[u8]) -> Result<Vec<LdCacheEntry>, LdCacheError> {
    let mut start = 0;
    if data.starts_with(OLD_MAGIC) {
        let count = read_u32(data, OLD_MAGIC.len()).ok_or(LdCacheError::Format {
            reason: "truncated old-format header",
        })? as usize;
        start = count
            .checked_mul(OLD_ENTRY_LEN)
            .and_then(|len| len.checked_add(OLD_HEADER_LEN))
            .ok_or(LdCacheError::Format {
                reason: "old-format entry count overflows",
            })?;
        // The new format follows, aligned to 8 bytes.
        start = start.div_ceil(8) * 8;
    }
    let table = data.get(start..).ok_or(LdCacheError::Format {
        reason: "old-format entries run past the end of the file",
    })?;
    if !table.starts_with(NEW_MAGIC) {
        return Err(LdCacheError::Format {
            reason: "no glibc-ld.so.cache1.1 header",
        });
    }
    let count = read_u32(table, NEW_MAGIC.len()).ok_or(LdCacheError::Format {
        reason: "truncated header",
    })? as usize;
    let mut entries = Vec::new();
    for index in 0..count {
        let Some(at) = index
            .checked_mul(NEW_ENTRY_LEN)
            .and_then(|offset| offset.checked_add(NEW_HEADER_LEN))
        else {
            break;
        };
        let (Some(flags), Some(key), Some(value)) = (
            read_u32(table, at),
            read_u32(table, at + 4),
            read_u32(table, at + 8),
        ) else {
            return Err(LdCacheError::Format {
                reason: "entries run past the end of the file",
            });
        };
        let flags = flags as i32;
        if flags & FLAG_TYPE_MASK & FLAG_ELF == 0 {
            continue;
        }
        if !FLAGS_64_BIT.contains(&(flags & FLAG_ARCH_MASK)) {
            continue;
        }
        let (Some(name), Some(path)) = (c_string(table, key), c_string(table, value)) else {
            continue;
        };
        if name.is_empty() || path.is_empty() {
            continue;
        }
        entries.push(LdCacheEntry { name, path });
    }
    Ok(entries)
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// The NUL-terminated UTF-8 string at `offset`; `None` outside the data, unterminated or not
/// UTF-8.
fn c_string(data: &[u8], offset: u32) -> Option<String> {
    let rest = data.get(usize::try_from(offset).ok()?..)?;
    let end = rest.iter().position(|byte| *byte == 0)?;
    std::str::from_utf8(&rest[..end]).ok().map(str::to_owned)
}

/// Writes a cache file of the new format listing `entries` as x86-64 libraries: what
/// `ldconfig` writes, for tests that lay out a driver root.
pub fn build(entries: &[LdCacheEntry]) -> Vec<u8> {
    let mut strings = Vec::new();
    let strings_start = NEW_HEADER_LEN + entries.len() * NEW_ENTRY_LEN;
    let mut table = Vec::new();
    for entry in entries {
        let key = strings_start + strings.len();
        strings.extend_from_slice(entry.name.as_bytes());
        strings.push(0);
        let value = strings_start + strings.len();
        strings.extend_from_slice(entry.path.as_bytes());
        strings.push(0);
        let offset = |at: usize| u32::try_from(at).unwrap_or(u32::MAX).to_le_bytes();
        table.extend_from_slice(&0x0303_i32.to_le_bytes()); // ELF libc6, x86-64
        table.extend_from_slice(&offset(key));
        table.extend_from_slice(&offset(value));
        table.extend_from_slice(&0_u32.to_le_bytes()); // OS version
        table.extend_from_slice(&0_u64.to_le_bytes()); // hwcap
    }
    let mut data = Vec::with_capacity(strings_start + strings.len());
    data.extend_from_slice(NEW_MAGIC);
    let count = u32::try_from(entries.len()).unwrap_or(u32::MAX);
    data.extend_from_slice(&count.to_le_bytes());
    let strings_len = u32::try_from(strings.len()).unwrap_or(u32::MAX);
    data.extend_from_slice(&strings_len.to_le_bytes());
    data.resize(NEW_HEADER_LEN, 0);
    data.extend_from_slice(&table);
    data.extend_from_slice(&strings);
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, path: &str) -> LdCacheEntry {
        LdCacheEntry {
            name: name.into(),
            path: path.into(),
        }
    }

    #[test]
    fn reads_back_what_it_builds() {
        let entries = vec![
            entry("libcuda.so.1", "/usr/lib64/nvidia/libcuda.so.1"),
            entry("libc.so.6", "/lib64/libc.so.6"),
        ];
        assert_eq!(parse(&build(&entries)).unwrap(), entries);
    }

    #[test]
    fn skips_32_bit_entries_and_reads_after_an_old_format_table() {
        let mut data = build(&[entry("libcuda.so.1", "/usr/lib/libcuda.so.1")]);
        // Mark the entry i386 (arch 0x0000): skipped.
        let mut i386 = data.clone();
        i386[NEW_HEADER_LEN..NEW_HEADER_LEN + 4].copy_from_slice(&0x0003_i32.to_le_bytes());
        assert_eq!(parse(&i386).unwrap(), vec![]);
        // An old-format table of one entry before it: 16 + 12 = 28 bytes, padded to 32.
        let mut old = OLD_MAGIC.to_vec();
        old.extend_from_slice(&1_u32.to_le_bytes());
        old.extend_from_slice(&[0; OLD_ENTRY_LEN]);
        old.resize(32, 0);
        old.append(&mut data);
        assert_eq!(
            parse(&old).unwrap(),
            vec![entry("libcuda.so.1", "/usr/lib/libcuda.so.1")]
        );
    }

    #[test]
    fn malformed_files_are_errors_or_skipped_entries_never_panics() {
        assert!(parse(b"").is_err());
        assert!(parse(b"something else entirely").is_err());
        let good = build(&[entry("libcuda.so.1", "/usr/lib/libcuda.so.1")]);
        for len in 0..good.len() {
            // Every truncation: an error or fewer entries, no panic.
            let _ = parse(&good[..len]);
        }
        // An entry pointing past the end: skipped.
        let mut bad = good.clone();
        bad[NEW_HEADER_LEN + 4..NEW_HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse(&bad).unwrap(), vec![]);
        // A huge entry count with no entries: an error, not an allocation.
        let mut huge = good;
        huge[NEW_MAGIC.len()..NEW_MAGIC.len() + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&huge).is_err());
    }
}

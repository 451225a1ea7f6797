//! A client of `nvidia-persistenced`'s control socket, the one thing that makes the daemon let
//! go of a GPU.
//!
//! While the daemon keeps a GPU in persistence mode it holds `/dev/nvidia<minor>` open, so a
//! GPU cannot become idle for vfio-pci. NVML's `nvmlDeviceSetPersistenceMode` changes the
//! driver's own (legacy) setting and does not reach the daemon; `nvidia-smi -pm 0` asks the
//! daemon when it runs, and that is what upstream runs (kubernetes-sigs/dra-driver-nvidia-gpu
//! PR #1038, issue #1037). The plugin asks the daemon itself, without `nvidia-smi` (no program
//! to ship or chroot into): the daemon serves ONC RPC (RFC 5531) over a Unix stream socket at
//! `/var/run/nvidia-persistenced/socket`, program 35006, version 1, procedure 1
//! `SetPersistenceMode({domain, bus, slot, function}, mode)` and procedure 2
//! `GetPersistenceMode({domain, bus, slot, function})`, each answering an `NvPdStatus`
//! (facts from the daemon's published source, `nvpd_rpc.h` and `nvidia-persistenced.c`).
//!
//! Verified only against `nvml_mock::FakePersistenced`, a test double written from the same
//! source; not yet against a real daemon.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::backend::normalize_pci_bus_id;
use crate::host::{Host, HostError};

/// Where the daemon's socket is, as host paths, in the order they are tried: `/var/run` is
/// `/run` on current distributions, but the link may be absolute and point outside the host
/// root the plugin sees.
pub const SOCKET_PATHS: [&str; 2] = [
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
];

/// The socket under a driver root (the GPU operator runs the daemon in its driver container,
/// whose root the host sees at `/run/nvidia/driver`).
pub const DRIVER_ROOT_SOCKET: &str = "run/nvidia-persistenced/socket";

/// The daemon's RPC program number (`NVPD_PROG`).
const PROGRAM: u32 = 35006;
/// The version whose procedures the client calls (`VersionOne`).
const VERSION: u32 = 1;
/// `nvPdSetPersistenceMode`.
const SET_PERSISTENCE_MODE: u32 = 1;
/// `nvPdGetPersistenceMode`.
const GET_PERSISTENCE_MODE: u32 = 2;

/// How long one call may take: the daemon answers at once, but opening a GPU for it takes
/// the driver a few seconds on large GPUs.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Replies are a few words; anything longer is not the daemon.
const MAX_REPLY: usize = 4096;

/// Why the daemon could not be asked, or said no.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PersistencedError {
    /// The socket could not be reached or the exchange broke off.
    #[error("talking to nvidia-persistenced at {socket}: {source}")]
    Io {
        /// The socket (host path).
        socket: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// The answer is not the daemon's protocol.
    #[error("nvidia-persistenced at {socket} answered unexpectedly: {reason}")]
    Protocol {
        /// The socket (host path).
        socket: PathBuf,
        /// What is wrong with the answer.
        reason: String,
    },
    /// The daemon refused.
    #[error("nvidia-persistenced refused to {action} for {bus_id}: {status}")]
    Refused {
        /// What was asked (`turn persistence mode off`).
        action: &'static str,
        /// The GPU.
        bus_id: String,
        /// The daemon's `NvPdStatus`, by name.
        status: String,
    },
    /// The bus ID cannot be sent.
    #[error("{0}")]
    BusId(String),
}

impl PersistencedError {
    /// Whether nobody listens on the socket (a daemon that exited and left its socket file,
    /// or a socket of another mount namespace): then there is no daemon to ask.
    pub fn no_daemon(&self) -> bool {
        matches!(self, Self::Io { source, .. } if matches!(
            source.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
        ))
    }
}

/// The `NvPdStatus` names, by value (`nvpd_rpc.h`).
fn status_name(status: u32) -> String {
    match status {
        0 => "NVPD_SUCCESS".into(),
        1 => "NVPD_ERR_DAEMON_NOT_PRESENT".into(),
        2 => "NVPD_ERR_DEVICE_NOT_FOUND".into(),
        3 => "NVPD_ERR_DRIVER".into(),
        4 => "NVPD_ERR_INSUFFICIENT_RESOURCES".into(),
        5 => "NVPD_ERR_INVALID_ARGUMENT".into(),
        6 => "NVPD_ERR_IO".into(),
        7 => "NVPD_ERR_PERMISSIONS".into(),
        8 => "NVPD_ERR_RPC".into(),
        9 => "NVPD_ERR_USER_NOT_FOUND".into(),
        10 => "NVPD_ERR_NUMA_FAILURE".into(),
        11 => "NVPD_ERR_UNKNOWN".into(),
        other => format!("status {other}"),
    }
}

/// `NVPD_ERR_DEVICE_NOT_FOUND`: the daemon does not manage this GPU.
const DEVICE_NOT_FOUND: u32 = 2;

/// A running `nvidia-persistenced`, reached through its socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Persistenced {
    /// The socket as a host path (for messages).
    socket: PathBuf,
    /// Where it is in this process's filesystem.
    resolved: PathBuf,
}

impl Persistenced {
    /// The daemon whose socket is at the first of `candidates` (host paths) that exists on
    /// `host`; `None` when none does (no daemon runs, or it runs where the plugin cannot see
    /// its socket).
    pub fn find(host: &dyn Host, candidates: &[PathBuf]) -> Result<Option<Self>, HostError> {
        for socket in candidates {
            if host.exists(socket)? {
                return Ok(Some(Self {
                    socket: socket.clone(),
                    resolved: host.resolve(socket),
                }));
            }
        }
        Ok(None)
    }

    /// The socket, as a host path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether the daemon keeps the GPU at `bus_id` in persistence mode; `None` when it does
    /// not manage that GPU (it knows only the GPUs that were on `nvidia` when it started).
    pub fn mode(&self, bus_id: &str) -> Result<Option<bool>, PersistencedError> {
        let args = device_words(bus_id)?;
        let reply = self.call(GET_PERSISTENCE_MODE, &args)?;
        let status = *reply.first().ok_or_else(|| self.short_reply())?;
        match status {
            0 => {
                let mode = *reply.get(1).ok_or_else(|| self.short_reply())?;
                Ok(Some(mode == 1))
            }
            DEVICE_NOT_FOUND => Ok(None),
            other => Err(PersistencedError::Refused {
                action: "report persistence mode",
                bus_id: bus_id.to_owned(),
                status: status_name(other),
            }),
        }
    }

    /// Asks the daemon to keep the GPU at `bus_id` open (`enabled`) or to close it.
    pub fn set_mode(&self, bus_id: &str, enabled: bool) -> Result<(), PersistencedError> {
        let mut args = device_words(bus_id)?.to_vec();
        args.push(u32::from(enabled));
        let reply = self.call(SET_PERSISTENCE_MODE, &args)?;
        match reply.first() {
            Some(0) => Ok(()),
            Some(other) => Err(PersistencedError::Refused {
                action: if enabled {
                    "turn persistence mode on"
                } else {
                    "turn persistence mode off"
                },
                bus_id: bus_id.to_owned(),
                status: status_name(*other),
            }),
            None => Err(self.short_reply()),
        }
    }

    fn short_reply(&self) -> PersistencedError {
        self.protocol("the reply ends before its result")
    }

    fn protocol(&self, reason: impl Into<String>) -> PersistencedError {
        PersistencedError::Protocol {
            socket: self.socket.clone(),
            reason: reason.into(),
        }
    }

    fn io(&self, source: io::Error) -> PersistencedError {
        PersistencedError::Io {
            socket: self.socket.clone(),
            source,
        }
    }

    /// One call on a fresh connection: the words of the result, after the RPC header.
    fn call(&self, procedure: u32, args: &[u32]) -> Result<Vec<u32>, PersistencedError> {
        static NEXT_XID: AtomicU32 = AtomicU32::new(1);
        let xid = NEXT_XID.fetch_add(1, Ordering::Relaxed) ^ std::process::id().rotate_left(16);
        let mut stream = UnixStream::connect(&self.resolved).map_err(|e| self.io(e))?;
        stream
            .set_read_timeout(Some(CALL_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(CALL_TIMEOUT)))
            .map_err(|e| self.io(e))?;
        stream
            .write_all(&encode_call(xid, procedure, args))
            .map_err(|e| self.io(e))?;
        let reply = read_record(&mut stream, MAX_REPLY).map_err(|e| match e {
            RecordError::Io(e) => self.io(e),
            RecordError::TooLong => self.protocol(format!("a reply longer than {MAX_REPLY} bytes")),
        })?;
        decode_reply(xid, &reply).map_err(|reason| self.protocol(reason))
    }
}

/// `{domain, bus, slot, function}` of a PCI bus ID, as `NvPciDevice`'s four ints.
fn device_words(bus_id: &str) -> Result<[u32; 4], PersistencedError> {
    let normalized =
        normalize_pci_bus_id(bus_id).map_err(|e| PersistencedError::BusId(e.to_string()))?;
    // normalize_pci_bus_id returns `dddd:bb:ss.f`, all hex.
    let invalid = || PersistencedError::BusId(format!("invalid PCI bus ID {bus_id:?}"));
    let (domain, rest) = normalized.split_once(':').ok_or_else(invalid)?;
    let (bus, rest) = rest.split_once(':').ok_or_else(invalid)?;
    let (slot, function) = rest.split_once('.').ok_or_else(invalid)?;
    let hex = |text: &str| u32::from_str_radix(text, 16).map_err(|_| invalid());
    Ok([hex(domain)?, hex(bus)?, hex(slot)?, hex(function)?])
}

/// A call message in one record-marked fragment: the RPC header with `AUTH_NONE` credentials
/// and verifier, then the arguments, each an XDR int (big-endian, 4 bytes).
fn encode_call(xid: u32, procedure: u32, args: &[u32]) -> Vec<u8> {
    let words = [
        xid, 0, /* CALL */
        2, /* RPC version */
        PROGRAM, VERSION, procedure, 0, 0, /* credentials: AUTH_NONE, empty */
        0, 0, /* verifier: AUTH_NONE, empty */
    ];
    record(words.iter().chain(args))
}

/// Words in one record-marked fragment (RFC 5531 section 11: a 4-byte header, the top bit
/// marking the last fragment, the rest the length).
fn record<'a>(words: impl Iterator<Item = &'a u32>) -> Vec<u8> {
    let body: Vec<u8> = words.flat_map(|word| word.to_be_bytes()).collect();
    let mut out = Vec::with_capacity(body.len() + 4);
    // The body is a handful of words: its length fits the 31 bits.
    let length = u32::try_from(body.len()).unwrap_or(u32::MAX) & 0x7fff_ffff;
    out.extend_from_slice(&(0x8000_0000 | length).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Why a record could not be read.
#[derive(Debug)]
enum RecordError {
    /// The stream failed or ended.
    Io(io::Error),
    /// Longer than allowed.
    TooLong,
}

/// One record (all its fragments) from a stream, at most `max` bytes.
fn read_record(stream: &mut impl Read, max: usize) -> Result<Vec<u8>, RecordError> {
    let mut out = Vec::new();
    loop {
        let mut header = [0u8; 4];
        stream.read_exact(&mut header).map_err(RecordError::Io)?;
        let header = u32::from_be_bytes(header);
        let length = (header & 0x7fff_ffff) as usize;
        if out.len() + length > max {
            return Err(RecordError::TooLong);
        }
        let start = out.len();
        out.resize(start + length, 0);
        stream
            .read_exact(&mut out[start..])
            .map_err(RecordError::Io)?;
        if header & 0x8000_0000 != 0 {
            return Ok(out);
        }
    }
}

/// The result words of an accepted, successful reply to call `xid`.
fn decode_reply(xid: u32, reply: &[u8]) -> Result<Vec<u32>, String> {
    let mut words = reply
        .chunks(4)
        .map(|chunk| {
            <[u8; 4]>::try_from(chunk)
                .map(u32::from_be_bytes)
                .map_err(|_| "a reply that is not whole XDR words".to_owned())
        })
        .collect::<Result<Vec<u32>, String>>()?
        .into_iter();
    let mut next = |what: &str| {
        words
            .next()
            .ok_or_else(|| format!("the reply ends before its {what}"))
    };
    let got = next("transaction ID")?;
    if got != xid {
        return Err(format!("a reply to transaction {got}, not {xid}"));
    }
    if next("message type")? != 1 {
        return Err("a message that is not a reply".into());
    }
    match next("reply status")? {
        0 => {}
        1 => return Err("the call was denied (authentication or RPC version)".into()),
        other => return Err(format!("reply status {other}")),
    }
    let _flavor = next("verifier")?;
    let length = next("verifier length")? as usize;
    for _ in 0..length.div_ceil(4) {
        next("verifier")?;
    }
    match next("accept status")? {
        0 => Ok(words.collect()),
        1 => Err(format!("program {PROGRAM} is not served there")),
        2 => Err(format!(
            "version {VERSION} of program {PROGRAM} is not served there"
        )),
        3 => Err("the procedure is not served there".into()),
        4 => Err("the daemon could not decode the arguments".into()),
        5 => Err("the daemon failed (system error)".into()),
        other => Err(format!("accept status {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_become_the_four_ints_of_nv_pci_device() {
        assert_eq!(device_words("0000:b7:1f.3").unwrap(), [0, 0xb7, 0x1f, 3]);
        assert_eq!(
            device_words("00000001:07:00.0").unwrap(),
            [1, 7, 0, 0],
            "NVML's 8-digit domain"
        );
        assert!(device_words("07:00").is_err());
    }

    #[test]
    fn a_call_is_one_record_marked_fragment() {
        let bytes = encode_call(7, SET_PERSISTENCE_MODE, &[0, 7, 0, 0, 0]);
        // Header, then 10 header words and 5 argument words.
        assert_eq!(&bytes[..4], &(0x8000_0000u32 | 60).to_be_bytes());
        assert_eq!(bytes.len(), 64);
        assert_eq!(&bytes[4..8], &7u32.to_be_bytes());
        assert_eq!(&bytes[16..20], &PROGRAM.to_be_bytes());
        let record = read_record(&mut &bytes[..], 100).unwrap();
        assert_eq!(record.len(), 60);
    }

    #[test]
    fn fragments_are_joined_and_long_records_refused() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&4u32.to_be_bytes());
        bytes.extend_from_slice(&1u32.to_be_bytes());
        bytes.extend_from_slice(&(0x8000_0000u32 | 4).to_be_bytes());
        bytes.extend_from_slice(&2u32.to_be_bytes());
        let record = read_record(&mut &bytes[..], 100).unwrap();
        assert_eq!(record, [0, 0, 0, 1, 0, 0, 0, 2]);
        assert!(matches!(
            read_record(&mut &bytes[..], 6),
            Err(RecordError::TooLong)
        ));
    }

    fn reply(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_be_bytes()).collect()
    }

    #[test]
    fn replies_are_checked_word_by_word() {
        // Accepted, AUTH_NONE verifier, success, result NVPD_SUCCESS.
        assert_eq!(decode_reply(9, &reply(&[9, 1, 0, 0, 0, 0, 0])), Ok(vec![0]));
        // A verifier with a body of 5 bytes (padded to 8) is skipped.
        assert_eq!(
            decode_reply(9, &reply(&[9, 1, 0, 1, 5, 0xaa, 0xbb, 0, 2, 1])),
            Ok(vec![2, 1])
        );
        assert!(
            decode_reply(9, &reply(&[8, 1, 0, 0, 0, 0, 0]))
                .unwrap_err()
                .contains("transaction 8")
        );
        assert!(
            decode_reply(9, &reply(&[9, 1, 0, 0, 0, 1]))
                .unwrap_err()
                .contains("program 35006")
        );
        assert!(
            decode_reply(9, &reply(&[9, 1, 1, 0]))
                .unwrap_err()
                .contains("denied")
        );
        assert!(decode_reply(9, &[0, 0, 0]).is_err());
    }

    #[test]
    fn statuses_are_named_as_the_daemon_names_them() {
        assert_eq!(status_name(7), "NVPD_ERR_PERMISSIONS");
        assert_eq!(status_name(42), "status 42");
    }
}

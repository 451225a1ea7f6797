//! [`FakePersistenced`]: a stand-in for `nvidia-persistenced` on a mock machine's root.
//!
//! The real daemon keeps each GPU it manages open (so the driver keeps it initialised) and
//! takes orders on a Unix socket, `/var/run/nvidia-persistenced/socket`, in ONC RPC (RFC 5531,
//! record marking on a stream): program 35006, version 1, procedure 1 `SetPersistenceMode`
//! (`NvPciDevice {domain, bus, slot, function}`, mode 0 or 1) and 2 `GetPersistenceMode`
//! (`NvPciDevice`), each answering an `NvPdStatus` (and the mode for procedure 2). Facts from
//! the daemon's published source (`nvpd_rpc.h`, `nvpd_rpc_xdr.c`, `nvidia-persistenced.c`):
//! it starts with every GPU in persistence mode, finds a GPU by domain, bus and slot (the
//! function is ignored), answers `NVPD_ERR_DEVICE_NOT_FOUND` (2) for a GPU it does not
//! manage and `NVPD_ERR_INVALID_ARGUMENT` (5) for a mode other than 0 and 1, and closes the
//! GPU when its mode goes off.
//!
//! This fake does the same on a mock machine: it listens on
//! `<root>/run/nvidia-persistenced/socket`, and shows its hold on each GPU in persistence mode
//! as the kernel's `/proc` would (`<root>/proc/<pid>/fd/<n>` → `/dev/nvidia<minor>`, `comm`
//! `nvidia-persiste`, the first 15 bytes of the name), so the driver's idle wait sees it. It
//! decodes calls itself, independently of the driver's client, so that a wrong encoding on
//! either side fails the tests. Version 2 of the program (`SetPersistenceModeOnly`, NUMA) and
//! the daemon's failure to reopen a GPU that was unbound and bound again are not modelled.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Where the socket is under the machine's root.
pub const SOCKET: &str = "run/nvidia-persistenced/socket";

/// The daemon's program number.
const PROGRAM: u32 = 35006;

/// A request the fake daemon received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PersistencedRequest {
    /// `GetPersistenceMode` of the GPU at this bus ID (`dddd:bb:ss.f`).
    Get {
        /// The GPU.
        bus_id: String,
    },
    /// `SetPersistenceMode`.
    Set {
        /// The GPU.
        bus_id: String,
        /// Mode 1 (on) or 0 (off).
        enabled: bool,
    },
}

type Observer = Arc<dyn Fn(&PersistencedRequest) + Send + Sync>;

struct Device {
    /// Domain, bus, slot.
    location: (u32, u32, u32),
    minor: u32,
    enabled: bool,
}

struct State {
    root: PathBuf,
    pid: u32,
    devices: Vec<Device>,
    requests: Vec<PersistencedRequest>,
    observer: Option<Observer>,
}

/// A fake `nvidia-persistenced` serving its socket on a thread; stopped when dropped.
pub struct FakePersistenced {
    socket: PathBuf,
    shared: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FakePersistenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakePersistenced")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

fn lock(shared: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every update is a whole assignment or push: a poisoned lock is still consistent.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `(domain, bus, slot, function)` of a bus ID `dddd:bb:ss.f` (hex).
fn location(bus_id: &str) -> Option<(u32, u32, u32, u32)> {
    let (domain, rest) = bus_id.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (slot, function) = rest.split_once('.')?;
    let hex = |text: &str| u32::from_str_radix(text, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(slot)?, hex(function)?))
}

impl FakePersistenced {
    /// Starts the daemon on the machine at `root` as process `pid`, managing `gpus` (sysfs bus
    /// ID and minor), every one in persistence mode as the daemon starts them.
    pub fn start(root: &Path, pid: u32, gpus: &[(String, u32)]) -> io::Result<Self> {
        let devices = gpus
            .iter()
            .map(|(bus_id, minor)| {
                let (domain, bus, slot, _) = location(bus_id).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{bus_id:?} is not a bus ID"),
                    )
                })?;
                Ok(Device {
                    location: (domain, bus, slot),
                    minor: *minor,
                    enabled: true,
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        let process = root.join("proc").join(pid.to_string());
        std::fs::create_dir_all(process.join("fd"))?;
        std::fs::write(process.join("comm"), "nvidia-persiste\n")?;
        let state = State {
            root: root.to_owned(),
            pid,
            devices,
            requests: Vec::new(),
            observer: None,
        };
        for device in &state.devices {
            state.show(device)?;
        }
        let socket = root.join(SOCKET);
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)?;
        // Polled, so that stopping does not depend on the socket file still being there.
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Mutex::new(state));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let shared = Arc::clone(&shared);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("fake-persistenced".into())
                .spawn(move || serve(&listener, &shared, &stop))?
        };
        Ok(Self {
            socket,
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// The socket, in this process's filesystem.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether the daemon keeps the GPU at `bus_id` in persistence mode; `None` when it does
    /// not manage it.
    pub fn is_enabled(&self, bus_id: &str) -> Option<bool> {
        let (domain, bus, slot, _) = location(bus_id)?;
        lock(&self.shared)
            .devices
            .iter()
            .find(|device| device.location == (domain, bus, slot))
            .map(|device| device.enabled)
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<PersistencedRequest> {
        lock(&self.shared).requests.clone()
    }

    /// Calls `observer` with each request as it is served: after its effect, before the
    /// caller has the answer.
    pub fn on_request(&self, observer: impl Fn(&PersistencedRequest) + Send + Sync + 'static) {
        lock(&self.shared).observer = Some(Arc::new(observer));
    }
}

impl Drop for FakePersistenced {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl State {
    /// The daemon's descriptor of a GPU in `/proc`.
    fn fd_link(&self, device: &Device) -> PathBuf {
        self.root
            .join("proc")
            .join(self.pid.to_string())
            .join("fd")
            .join((100 + device.minor).to_string())
    }

    /// Shows the device as held (enabled) or not in `/proc`.
    fn show(&self, device: &Device) -> io::Result<()> {
        let link = self.fd_link(device);
        let _ = std::fs::remove_file(&link);
        if device.enabled {
            std::os::unix::fs::symlink(format!("/dev/nvidia{}", device.minor), &link)?;
        }
        Ok(())
    }
}

fn serve(listener: &UnixListener, shared: &Mutex<State>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        // One connection at a time, as the daemon's single-threaded svc_run serves them.
        while let Ok(call) = read_record(&mut stream) {
            let (reply, request) = answer(&call, shared);
            // Observed before the caller has its answer: what it does next comes after.
            if let Some(request) = request {
                let observer = lock(shared).observer.clone();
                if let Some(observer) = observer {
                    observer(&request);
                }
            }
            if stream.write_all(&reply).is_err() {
                break;
            }
        }
    }
}

/// One record from the stream: its fragments joined.
fn read_record(stream: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut record = Vec::new();
    loop {
        let mut header = [0u8; 4];
        stream.read_exact(&mut header)?;
        let header = u32::from_be_bytes(header);
        let length = (header & 0x7fff_ffff) as usize;
        if record.len() + length > 64 * 1024 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "record too long",
            ));
        }
        let start = record.len();
        record.resize(start + length, 0);
        stream.read_exact(&mut record[start..])?;
        if header & 0x8000_0000 != 0 {
            return Ok(record);
        }
    }
}

/// The reply to one call message, record-marked, and the request it carried.
fn answer(call: &[u8], shared: &Mutex<State>) -> (Vec<u8>, Option<PersistencedRequest>) {
    let mut words: VecDeque<u32> = call
        .chunks_exact(4)
        .map(|chunk| u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
        .collect();
    let xid = words.pop_front().unwrap_or(0);
    let accepted = |status: u32, results: &[u32]| {
        // Accepted, AUTH_NONE verifier, then the accept status and the results.
        let mut reply = vec![xid, 1, 0, 0, 0, status];
        reply.extend_from_slice(results);
        marked(&reply)
    };
    let garbage = || (accepted(4, &[]), None);
    let (Some(0), Some(rpc_version)) = (words.pop_front(), words.pop_front()) else {
        return garbage();
    };
    if rpc_version != 2 {
        // Denied: RPC_MISMATCH, versions 2 to 2.
        return (marked(&[xid, 1, 1, 0, 2, 2]), None);
    }
    let (Some(program), Some(version), Some(procedure)) =
        (words.pop_front(), words.pop_front(), words.pop_front())
    else {
        return garbage();
    };
    // Credentials and verifier: flavor, length, body padded to 4 bytes.
    for _ in 0..2 {
        let (Some(_flavor), Some(length)) = (words.pop_front(), words.pop_front()) else {
            return garbage();
        };
        for _ in 0..length.div_ceil(4) {
            if words.pop_front().is_none() {
                return garbage();
            }
        }
    }
    if program != PROGRAM {
        return (accepted(1, &[]), None);
    }
    if version != 1 {
        // Only version 1 is modelled.
        return (accepted(2, &[1, 1]), None);
    }
    let args: Vec<u32> = words.into_iter().collect();
    let mut state = lock(shared);
    match (procedure, args.as_slice()) {
        (0, []) => (accepted(0, &[]), None),
        (1, [domain, bus, slot, function, mode]) => {
            let request = PersistencedRequest::Set {
                bus_id: format!("{domain:04x}:{bus:02x}:{slot:02x}.{function:x}"),
                enabled: *mode == 1,
            };
            state.requests.push(request.clone());
            let status = state.set(*domain, *bus, *slot, *mode);
            (accepted(0, &[status]), Some(request))
        }
        (2, [domain, bus, slot, function]) => {
            let request = PersistencedRequest::Get {
                bus_id: format!("{domain:04x}:{bus:02x}:{slot:02x}.{function:x}"),
            };
            state.requests.push(request.clone());
            let results = match state
                .devices
                .iter()
                .find(|device| device.location == (*domain, *bus, *slot))
            {
                Some(device) => vec![0, u32::from(device.enabled)],
                None => vec![2],
            };
            (accepted(0, &results), Some(request))
        }
        (0..=2, _) => garbage(),
        // PROC_UNAVAIL.
        _ => (accepted(3, &[]), None),
    }
}

impl State {
    /// `nvPdSetDevicePersistenceMode`: the status it answers.
    fn set(&mut self, domain: u32, bus: u32, slot: u32, mode: u32) -> u32 {
        if mode > 1 {
            return 5;
        }
        let Some(position) = self
            .devices
            .iter()
            .position(|device| device.location == (domain, bus, slot))
        else {
            return 2;
        };
        self.devices[position].enabled = mode == 1;
        match self.show(&self.devices[position]) {
            Ok(()) => 0,
            // NVPD_ERR_IO: the tree could not be written.
            Err(_) => 6,
        }
    }
}

fn marked(words: &[u32]) -> Vec<u8> {
    let body: Vec<u8> = words.iter().flat_map(|word| word.to_be_bytes()).collect();
    let mut out = ((body.len() as u32) | 0x8000_0000).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

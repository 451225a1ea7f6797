//! Unix socket helpers: private binding, stale-socket removal and rolling-update names.
//!
//! A DRA plugin serves two sockets: the *registration* socket in the
//! kubelet's plugin registry directory (the kubelet finds it by watching the
//! directory) and the *DRA service* socket whose path the plugin reports in
//! `PluginInfo.endpoint`. [`SocketPaths`] picks both names the way the Go
//! library `k8s.io/dynamic-resource-allocation/kubeletplugin` does, including
//! the hashed fallbacks for the 108-byte `sun_path` limit; [`bind_private`]
//! binds them without ever exposing a world-writable socket file.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rustix::fs::Mode;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use sha2::{Digest, Sha256};

use crate::k8s::names::{LabelDefect, label_defect};

/// Size of Linux's `sockaddr_un.sun_path`, which includes the terminating
/// NUL: a socket path must be strictly shorter than this.
pub(crate) const SUN_PATH_LEN: usize = 108;

/// Longest DRA driver name the API server accepts.
const DRIVER_NAME_MAX_LEN: usize = 63;

/// Backlog of the listening sockets: the kubelet opens a handful of
/// connections at most.
const LISTEN_BACKLOG: i32 = 128;

/// Errors from choosing, binding or removing plugin sockets. Every variant
/// names the path or name it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// The driver name is not a DNS subdomain of at most 63 characters.
    #[error("invalid DRA driver name {name:?}: {reason}")]
    InvalidDriverName {
        /// The rejected name.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The pod UID cannot be part of a file name.
    #[error("invalid pod UID {pod_uid:?}: {reason}")]
    InvalidPodUid {
        /// The rejected UID.
        pod_uid: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A socket directory is relative; the kubelet needs absolute paths.
    #[error("socket directory {path:?} must be an absolute path")]
    RelativeDirectory {
        /// The relative directory.
        path: PathBuf,
    },
    /// A socket directory is not valid UTF-8, so it cannot be reported to
    /// the kubelet in `PluginInfo.endpoint` (a protobuf string).
    #[error("socket directory {path:?} is not valid UTF-8")]
    NonUtf8Directory {
        /// The offending directory.
        path: PathBuf,
    },
    /// The socket path does not fit in `sun_path`, and no shorter fallback
    /// name is left. `path` is the shortest candidate that was tried.
    #[error("socket path {path:?} is {len} bytes long; Unix sockets allow at most {max}", max = SUN_PATH_LEN - 1)]
    PathTooLong {
        /// The (shortest) candidate path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// The parent directory of the socket could not be created.
    #[error("cannot create socket directory {path:?}")]
    CreateDirectory {
        /// The directory.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// Another process is serving on the socket path.
    #[error("socket {path:?} is in use by another process (it accepted a connection)")]
    InUse {
        /// The live socket.
        path: PathBuf,
    },
    /// Something other than a socket exists at the path; it is left alone.
    #[error("{path:?} exists and is not a Unix socket; refusing to replace it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Checking the existing path (stat or probe connect) failed.
    #[error("cannot check existing socket {path:?}")]
    Inspect {
        /// The path.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// Removing the socket file failed.
    #[error("cannot remove socket {path:?}")]
    Remove {
        /// The path.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// Creating, restricting, binding or listening on the socket failed.
    #[error("cannot bind socket {path:?}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// [`bind_private`] was called outside a tokio runtime.
    #[error("binding socket {path:?} needs a tokio runtime, but none is running")]
    NoRuntime {
        /// The path.
        path: PathBuf,
    },
}

/// The two sockets of a DRA plugin.
///
/// # Example
///
/// ```
/// use std::path::Path;
/// use dra_sdk::advanced::SocketPaths;
///
/// let paths = SocketPaths::new(
///     "gpu.example.com",
///     Path::new("/var/lib/kubelet/plugins_registry"),
///     Path::new("/var/lib/kubelet/plugins"),
///     None,
/// )?;
/// assert_eq!(paths.registration, Path::new("/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock"));
/// assert_eq!(paths.dra, Path::new("/var/lib/kubelet/plugins/gpu.example.com/dra.sock"));
/// # Ok::<(), dra_sdk::advanced::SocketError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketPaths {
    /// The registration socket, in the kubelet's plugin registry directory.
    pub registration: PathBuf,
    /// The DRA service socket, reported to the kubelet as the plugin's endpoint.
    pub dra: PathBuf,
}

impl SocketPaths {
    /// Chooses the socket paths for `driver_name`.
    ///
    /// Without a pod UID: `<registrar_dir>/<driver>-reg.sock` and
    /// `<plugins_dir>/<driver>/dra.sock`.
    ///
    /// With a pod UID (rolling updates: two plugin pods of one driver run side
    /// by side, which needs kubelet 1.33+), each instance gets its own pair.
    /// The registration socket is the first of
    /// `<driver>-<podUID>-reg.sock`, `<driver>-<H8(podUID)>-reg.sock` and
    /// `dra-<H16(driver "\0" podUID)>-reg.sock` whose full path fits in
    /// `sun_path` (`Hn` = unpadded base64url of the first `n` bytes of the
    /// SHA-256 digest), as the Go library does; the DRA socket is
    /// `<plugins_dir>/<driver>/dra-<podUID>.sock`, or
    /// `dra-<H8(podUID)>.sock` when that is too long.
    ///
    /// Both directories must be absolute and valid UTF-8: the DRA socket path
    /// is sent to the kubelet as a string.
    pub fn new(
        driver_name: &str,
        registrar_dir: &Path,
        plugins_dir: &Path,
        pod_uid: Option<&str>,
    ) -> Result<SocketPaths, SocketError> {
        validate_driver_name(driver_name)?;
        for dir in [registrar_dir, plugins_dir] {
            if !dir.is_absolute() {
                return Err(SocketError::RelativeDirectory {
                    path: dir.to_path_buf(),
                });
            }
            if dir.to_str().is_none() {
                return Err(SocketError::NonUtf8Directory {
                    path: dir.to_path_buf(),
                });
            }
        }
        let driver_dir = plugins_dir.join(driver_name);
        let (registration_names, dra_names) = match pod_uid {
            None => (
                vec![format!("{driver_name}-reg.sock")],
                vec!["dra.sock".to_owned()],
            ),
            Some(pod_uid) => {
                validate_pod_uid(pod_uid)?;
                let pod_hash = hash_b64(&[pod_uid.as_bytes()], 8);
                let instance_hash =
                    hash_b64(&[driver_name.as_bytes(), b"\0", pod_uid.as_bytes()], 16);
                (
                    vec![
                        format!("{driver_name}-{pod_uid}-reg.sock"),
                        format!("{driver_name}-{pod_hash}-reg.sock"),
                        format!("dra-{instance_hash}-reg.sock"),
                    ],
                    vec![
                        format!("dra-{pod_uid}.sock"),
                        format!("dra-{pod_hash}.sock"),
                    ],
                )
            }
        };
        Ok(SocketPaths {
            registration: first_fitting(registrar_dir, &registration_names)?,
            dra: first_fitting(&driver_dir, &dra_names)?,
        })
    }
}

/// `base64url-nopad(SHA-256(parts...)[..len])`.
fn hash_b64(parts: &[&[u8]], len: usize) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    let digest = hasher.finalize();
    URL_SAFE_NO_PAD.encode(&digest[..len])
}

/// The first `dir/name` that fits in `sun_path`.
fn first_fitting(dir: &Path, names: &[String]) -> Result<PathBuf, SocketError> {
    let mut shortest: Option<PathBuf> = None;
    for name in names {
        let path = dir.join(name);
        if fits_sun_path(&path) {
            return Ok(path);
        }
        if shortest
            .as_ref()
            .is_none_or(|s| path_len(&path) < path_len(s))
        {
            shortest = Some(path);
        }
    }
    let path = shortest.unwrap_or_else(|| dir.to_path_buf());
    Err(SocketError::PathTooLong {
        len: path_len(&path),
        path,
    })
}

fn path_len(path: &Path) -> usize {
    path.as_os_str().as_bytes().len()
}

fn fits_sun_path(path: &Path) -> bool {
    path_len(path) < SUN_PATH_LEN
}

/// Checks the API server's rule for DRA driver names: a lowercase RFC 1123
/// DNS subdomain of at most 63 characters.
fn validate_driver_name(name: &str) -> Result<(), SocketError> {
    let invalid = |reason| SocketError::InvalidDriverName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if name.len() > DRIVER_NAME_MAX_LEN {
        return Err(invalid("must be at most 63 characters"));
    }
    for label in name.split('.') {
        match label_defect(label) {
            None => {}
            Some(LabelDefect::Empty) => {
                return Err(invalid("must not contain empty dot-separated parts"));
            }
            Some(LabelDefect::Character) => {
                return Err(invalid(
                    "must consist of lowercase letters, digits, '-' and '.' (a DNS subdomain)",
                ));
            }
            Some(LabelDefect::Edge) => {
                return Err(invalid(
                    "each dot-separated part must start and end with a letter or digit",
                ));
            }
        }
    }
    Ok(())
}

/// Pod UIDs are UUIDs; anything that could escape the directory or form a
/// hidden file name is refused.
fn validate_pod_uid(pod_uid: &str) -> Result<(), SocketError> {
    let invalid = |reason| SocketError::InvalidPodUid {
        pod_uid: pod_uid.to_owned(),
        reason,
    };
    if pod_uid.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if !pod_uid
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(invalid(
            "may only contain ASCII letters, digits, '-' and '_'",
        ));
    }
    Ok(())
}

/// Binds a listening Unix socket at `path` that only its owner can connect to.
///
/// - Creates the parent directory if it is missing.
/// - Replaces a stale socket (one nobody accepts connections on), but
///   refuses to touch a live socket or anything that is not a socket.
/// - Sets the socket's mode to `0600` *before* `bind`, so the file never
///   exists with looser permissions, whatever the process umask.
///
/// Must be called inside a tokio runtime with I/O enabled.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), dra_sdk::advanced::SocketError> {
/// let listener = dra_sdk::advanced::bind_private(
///     std::path::Path::new("/var/lib/kubelet/plugins/gpu.example.com/dra.sock"),
/// )?;
/// # drop(listener);
/// # Ok(())
/// # }
/// ```
pub fn bind_private(path: &Path) -> Result<tokio::net::UnixListener, SocketError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(SocketError::NoRuntime {
            path: path.to_path_buf(),
        });
    }
    if !fits_sun_path(path) {
        return Err(SocketError::PathTooLong {
            path: path.to_path_buf(),
            len: path_len(path),
        });
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        // 0700 when it has to be created: only the kubelet (root) connects.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(parent)
            .map_err(|source| SocketError::CreateDirectory {
                path: parent.to_path_buf(),
                source,
            })?;
    }
    remove_if_stale(path)?;

    let bind_error = |source: io::Error| SocketError::Bind {
        path: path.to_path_buf(),
        source,
    };
    let address = SocketAddrUnix::new(path).map_err(|e| bind_error(e.into()))?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| bind_error(e.into()))?;
    // Linux creates the socket file with the mode of the socket's inode
    // (minus the umask), so restricting the fd first closes the window in
    // which a chmod after bind would leave the file open to everyone.
    rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR).map_err(|e| bind_error(e.into()))?;
    rustix::net::bind(&fd, &address).map_err(|e| bind_error(e.into()))?;
    rustix::net::listen(&fd, LISTEN_BACKLOG).map_err(|e| bind_error(e.into()))?;
    let listener = std::os::unix::net::UnixListener::from(fd);
    let listener = tokio::net::UnixListener::from_std(listener).map_err(bind_error)?;
    tracing::debug!(path = %path.display(), "listening on private Unix socket");
    Ok(listener)
}

/// Removes `path` if it is a socket nobody listens on.
fn remove_if_stale(path: &Path) -> Result<(), SocketError> {
    let inspect_error = |source: io::Error| SocketError::Inspect {
        path: path.to_path_buf(),
        source,
    };
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(inspect_error(error)),
    };
    if !metadata.file_type().is_socket() {
        return Err(SocketError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    // A non-blocking probe: a live listener with a full backlog answers
    // EAGAIN instead of making us wait.
    let address = SocketAddrUnix::new(path).map_err(|e| inspect_error(e.into()))?;
    let probe = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| inspect_error(e.into()))?;
    match rustix::net::connect(&probe, &address) {
        Ok(()) | Err(rustix::io::Errno::AGAIN) => Err(SocketError::InUse {
            path: path.to_path_buf(),
        }),
        Err(rustix::io::Errno::CONNREFUSED) => {
            tracing::info!(path = %path.display(), "removing stale socket left by a previous instance");
            remove_socket(path)
        }
        // Removed between our stat and the probe: nothing left to clean up.
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(error) => Err(inspect_error(error.into())),
    }
}

/// Removes the socket file at `path`; a missing file is not an error.
///
/// Anything other than a socket is left in place and reported as
/// [`SocketError::NotASocket`].
///
/// # Example
///
/// ```no_run
/// dra_sdk::advanced::remove_socket(std::path::Path::new(
///     "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock",
/// ))?;
/// # Ok::<(), dra_sdk::advanced::SocketError>(())
/// ```
pub fn remove_socket(path: &Path) -> Result<(), SocketError> {
    let remove_error = |source: io::Error| SocketError::Remove {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if !metadata.file_type().is_socket() => {
            return Err(SocketError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(remove_error(error)),
    }
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(remove_error(error)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const DRIVER: &str = "gpu.example.com";
    const POD: &str = "4f6e2a51-8c1d-4b6e-9a7f-2d3c4b5a6e7f";

    /// A directory path of exactly `len` bytes (`/` followed by `a`s).
    fn dir_of_len(len: usize) -> PathBuf {
        PathBuf::from(format!("/{}", "a".repeat(len - 1)))
    }

    #[test]
    fn default_names() {
        let paths = SocketPaths::new(
            DRIVER,
            Path::new("/var/lib/kubelet/plugins_registry"),
            Path::new("/var/lib/kubelet/plugins"),
            None,
        )
        .unwrap();
        assert_eq!(
            paths,
            SocketPaths {
                registration: "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock".into(),
                dra: "/var/lib/kubelet/plugins/gpu.example.com/dra.sock".into(),
            }
        );
    }

    #[test]
    fn rolling_update_names_with_pod_uid() {
        let paths = SocketPaths::new(
            DRIVER,
            Path::new("/var/lib/kubelet/plugins_registry"),
            Path::new("/var/lib/kubelet/plugins"),
            Some(POD),
        )
        .unwrap();
        assert_eq!(
            paths.registration,
            Path::new(&format!(
                "/var/lib/kubelet/plugins_registry/{DRIVER}-{POD}-reg.sock"
            ))
        );
        assert_eq!(
            paths.dra,
            Path::new(&format!("/var/lib/kubelet/plugins/{DRIVER}/dra-{POD}.sock"))
        );
    }

    #[test]
    fn hashes_are_sha256_prefixes_in_unpadded_base64url() {
        let pod_hash = hash_b64(&[POD.as_bytes()], 8);
        let instance_hash = hash_b64(&[DRIVER.as_bytes(), b"\0", POD.as_bytes()], 16);
        assert_eq!(pod_hash.len(), 11);
        assert_eq!(instance_hash.len(), 22);
        assert!(!pod_hash.contains(['=', '+', '/']));
        assert_eq!(pod_hash, POD_HASH);
        assert_eq!(instance_hash, INSTANCE_HASH);
    }

    /// `base64url-nopad(SHA-256(POD)[..8])`, computed with Python's hashlib.
    const POD_HASH: &str = "k2vOZp65F8o";
    /// `base64url-nopad(SHA-256(DRIVER "\0" POD)[..16])`, likewise.
    const INSTANCE_HASH: &str = "Ux-T2OjrWnckvBJQpbMj4g";

    #[test]
    fn registration_name_fallbacks_at_the_108_byte_boundary() {
        let plugins = Path::new("/plugins");
        let first = format!("{DRIVER}-{POD}-reg.sock");
        let second = format!("{DRIVER}-{POD_HASH}-reg.sock");
        let third = format!("dra-{INSTANCE_HASH}-reg.sock");

        // dir + "/" + name: 107 bytes fits, 108 does not.
        let dir = dir_of_len(107 - 1 - first.len());
        let paths = SocketPaths::new(DRIVER, &dir, plugins, Some(POD)).unwrap();
        assert_eq!(path_len(&paths.registration), 107);
        assert_eq!(paths.registration, dir.join(&first));

        let dir = dir_of_len(108 - 1 - first.len());
        let paths = SocketPaths::new(DRIVER, &dir, plugins, Some(POD)).unwrap();
        assert_eq!(paths.registration, dir.join(&second));

        let dir = dir_of_len(107 - 1 - second.len());
        let paths = SocketPaths::new(DRIVER, &dir, plugins, Some(POD)).unwrap();
        assert_eq!(paths.registration, dir.join(&second));

        let dir = dir_of_len(108 - 1 - second.len());
        let paths = SocketPaths::new(DRIVER, &dir, plugins, Some(POD)).unwrap();
        assert_eq!(paths.registration, dir.join(&third));

        let dir = dir_of_len(107 - 1 - third.len());
        let paths = SocketPaths::new(DRIVER, &dir, plugins, Some(POD)).unwrap();
        assert_eq!(paths.registration, dir.join(&third));
        assert_eq!(path_len(&paths.registration), 107);

        let dir = dir_of_len(108 - 1 - third.len());
        match SocketPaths::new(DRIVER, &dir, plugins, Some(POD)) {
            Err(SocketError::PathTooLong { path, len }) => {
                assert_eq!(path, dir.join(&third));
                assert_eq!(len, 108);
            }
            other => panic!("expected PathTooLong, got {other:?}"),
        }
    }

    #[test]
    fn dra_name_fallback_at_the_108_byte_boundary() {
        let registry = Path::new("/registry");
        let first = format!("{DRIVER}/dra-{POD}.sock");
        let second = format!("{DRIVER}/dra-{POD_HASH}.sock");

        let dir = dir_of_len(107 - 1 - first.len());
        let paths = SocketPaths::new(DRIVER, registry, &dir, Some(POD)).unwrap();
        assert_eq!(paths.dra, dir.join(&first));
        assert_eq!(path_len(&paths.dra), 107);

        let dir = dir_of_len(108 - 1 - first.len());
        let paths = SocketPaths::new(DRIVER, registry, &dir, Some(POD)).unwrap();
        assert_eq!(paths.dra, dir.join(&second));

        let dir = dir_of_len(108 - 1 - second.len());
        assert!(matches!(
            SocketPaths::new(DRIVER, registry, &dir, Some(POD)),
            Err(SocketError::PathTooLong { len: 108, .. })
        ));
        // Without a pod UID there is no fallback at all.
        let dir = dir_of_len(108 - 1 - format!("{DRIVER}/dra.sock").len());
        assert!(matches!(
            SocketPaths::new(DRIVER, registry, &dir, None),
            Err(SocketError::PathTooLong { len: 108, .. })
        ));
    }

    #[test]
    fn rejects_bad_driver_names_pod_uids_and_directories() {
        let abs = Path::new("/x");
        for name in [
            "",
            "Gpu.example.com",
            "gpu..example.com",
            "-gpu.example.com",
            "gpu_example",
            "gpu.example.com-",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(
                    SocketPaths::new(name, abs, abs, None),
                    Err(SocketError::InvalidDriverName { .. })
                ),
                "{name:?} accepted"
            );
        }
        assert!(SocketPaths::new(&"a".repeat(63), abs, abs, None).is_ok());
        for uid in ["", "../x", "a/b", ".hidden", "a\0b"] {
            assert!(
                matches!(
                    SocketPaths::new(DRIVER, abs, abs, Some(uid)),
                    Err(SocketError::InvalidPodUid { .. })
                ),
                "{uid:?} accepted"
            );
        }
        assert!(matches!(
            SocketPaths::new(DRIVER, Path::new("relative"), abs, None),
            Err(SocketError::RelativeDirectory { .. })
        ));
        let error = SocketPaths::new("Bad", abs, abs, None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("\"Bad\""), "{error}");
    }

    #[tokio::test]
    async fn bound_socket_is_private_and_accepts_connections() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/dir/plugin.sock");
        let listener = bind_private(&path).unwrap();
        let mode = std::fs::symlink_metadata(&path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
        let (connected, accepted) =
            tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        connected.unwrap();
        accepted.unwrap();
    }

    #[tokio::test]
    async fn stale_socket_is_replaced_but_live_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.sock");

        let live = bind_private(&path).unwrap();
        assert!(matches!(
            bind_private(&path),
            Err(SocketError::InUse { .. })
        ));
        assert!(path.exists());

        // Dropping a tokio listener closes it but leaves the file: stale.
        drop(live);
        assert!(path.exists());
        let listener = bind_private(&path).unwrap();
        let (connected, accepted) =
            tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        connected.unwrap();
        accepted.unwrap();
    }

    #[tokio::test]
    async fn non_socket_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.sock");
        std::fs::write(&path, b"precious").unwrap();
        assert!(matches!(
            bind_private(&path),
            Err(SocketError::NotASocket { .. })
        ));
        assert!(matches!(
            remove_socket(&path),
            Err(SocketError::NotASocket { .. })
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }

    #[tokio::test]
    async fn remove_socket_removes_and_tolerates_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.sock");
        let _listener = bind_private(&path).unwrap();
        remove_socket(&path).unwrap();
        assert!(!path.exists());
        remove_socket(&path).unwrap();
    }

    #[test]
    fn bind_outside_a_runtime_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            bind_private(&dir.path().join("s.sock")),
            Err(SocketError::NoRuntime { .. })
        ));
    }
}

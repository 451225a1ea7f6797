//! [`RealCluster`]: the components, their command lines and the order they start in.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use super::node::{KubeletNode, NodePorts};
use super::pki::{Authority, CertFiles, Usage};
use super::process::{ManagedProcess, PrivateMount, Spawner};
use super::{Binaries, E2eError, ENV_KEEP, FEATURE_GATES, api_error, io_error};
use dra_sdk::driver::Driver;
use dra_sdk::plugin::{KubeletPlugin, PluginBuilder};

/// How long each component gets to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Between two readiness checks.
const POLL: Duration = Duration::from_millis(100);
/// The ServiceCluster IP range: only allocated from, never routed (nothing listens there).
const SERVICE_CIDR: &str = "10.0.0.0/24";
/// Prefix of the cluster folders in the temporary directory.
const DIR_PREFIX: &str = "dra-e2e-";

/// Which `resource.k8s.io` versions the API server serves: the newest release's, or those of
/// an older release, to test a driver against the clusters it supports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServedVersions {
    /// v1, v1beta2, v1beta1 and v1alpha3, as a 1.36 server with every DRA API enabled.
    #[default]
    Latest,
    /// v1beta2 and v1beta1, as Kubernetes 1.33 (v1 off).
    Like1_33,
    /// v1beta1 only, as Kubernetes 1.32 (v1 and v1beta2 off).
    Like1_32,
}

impl ServedVersions {
    fn runtime_config(self) -> String {
        let mut config = String::from(
            "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,\
             resource.k8s.io/v1alpha3=true,scheduling.k8s.io/v1alpha2=true",
        );
        match self {
            Self::Latest => {}
            Self::Like1_33 => config.push_str(",resource.k8s.io/v1=false"),
            Self::Like1_32 => {
                config.push_str(",resource.k8s.io/v1=false,resource.k8s.io/v1beta2=false");
            }
        }
        config
    }

    /// Whether `resource.k8s.io/v1` is served.
    pub fn serves_v1(self) -> bool {
        self == Self::Latest
    }
}

/// Configures a [`RealCluster`]; from [`RealCluster::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct RealClusterBuilder {
    binaries: PathBuf,
    nodes: Vec<String>,
    served: ServedVersions,
    feature_gates: Vec<(String, bool)>,
    scheduler: bool,
    controller_manager: bool,
}

impl RealClusterBuilder {
    /// The nodes, each with a kubelet and a CRI double of its own (default: one, `node-1`).
    /// Several kubelets run side by side on one machine with their own ports and folders.
    pub fn nodes<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.nodes = names.into_iter().map(Into::into).collect();
        self
    }

    /// The `resource.k8s.io` versions the API server serves (default: the newest release's).
    pub fn served_versions(mut self, served: ServedVersions) -> Self {
        self.served = served;
        self
    }

    /// Turns a feature gate on or off in every component (default: [`FEATURE_GATES`] on).
    pub fn feature_gate(mut self, name: impl Into<String>, enabled: bool) -> Self {
        let name = name.into();
        self.feature_gates.retain(|(gate, _)| *gate != name);
        self.feature_gates.push((name, enabled));
        self
    }

    /// Only etcd and the API server: no scheduler, controller manager or nodes. Starts in a few
    /// seconds; enough to test publishing.
    pub fn control_plane_only(mut self) -> Self {
        self.nodes.clear();
        self.scheduler = false;
        self.controller_manager = false;
        self
    }

    /// Starts the cluster and waits until every component is ready: the API server's
    /// `/readyz`, every Node `Ready`, the `default` ServiceAccount created (pods can be
    /// created). Works from any tokio runtime; the cluster does not depend on it afterwards.
    pub async fn start(self) -> Result<RealCluster, E2eError> {
        RealCluster::start_with(self).await
    }
}

/// Ports of the control plane.
struct ControlPlanePorts {
    etcd: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

/// The processes of the control plane, stopped in reverse order of start.
#[derive(Default)]
struct ControlPlane {
    etcd: Option<ManagedProcess>,
    apiserver: Option<ManagedProcess>,
    controller_manager: Option<ManagedProcess>,
    scheduler: Option<ManagedProcess>,
}

/// Where the cluster's files are.
struct ClusterDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for ClusterDir {
    fn drop(&mut self) {
        if !self.keep {
            remove_cluster_dir(&self.path);
        }
    }
}

/// A running cluster of real Kubernetes components. Dropping it stops them all.
///
/// See the [module docs](super) for the life cycle and an example.
pub struct RealCluster {
    // Field order is drop order: the processes go before the spawner thread, the folder last.
    control_plane: Mutex<ControlPlane>,
    nodes: Vec<KubeletNode>,
    spawner: Spawner,
    authority: Authority,
    binaries: Binaries,
    served: ServedVersions,
    server: String,
    kubeconfig: PathBuf,
    namespaces: AtomicU32,
    dir: ClusterDir,
}

impl std::fmt::Debug for RealCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealCluster")
            .field("server", &self.server)
            .field("dir", &self.dir.path)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl RealCluster {
    /// A builder for a cluster of the binaries in `binaries` (see
    /// [`binaries_or_skip`](super::binaries_or_skip)).
    pub fn builder(binaries: impl Into<PathBuf>) -> RealClusterBuilder {
        RealClusterBuilder {
            binaries: binaries.into(),
            nodes: vec!["node-1".to_owned()],
            served: ServedVersions::Latest,
            feature_gates: FEATURE_GATES
                .iter()
                .map(|gate| ((*gate).to_owned(), true))
                .collect(),
            scheduler: true,
            controller_manager: true,
        }
    }

    async fn start_with(config: RealClusterBuilder) -> Result<Self, E2eError> {
        let binaries = Binaries::new(&config.binaries)?;
        sweep_stale_dirs();
        let path = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(io_error("creating the cluster folder"))?
            .keep();
        let dir = ClusterDir {
            path,
            keep: std::env::var_os(ENV_KEEP).is_some_and(|value| !value.is_empty()),
        };
        for sub in ["pki", "logs", "etcd", "work"] {
            let sub = dir.path.join(sub);
            std::fs::create_dir_all(&sub)
                .map_err(io_error(format!("creating {}", sub.display())))?;
        }
        let mut ports = free_ports(5 + 2 * config.nodes.len())?.into_iter();
        let mut next_port = || ports.next().unwrap_or_default();
        let control_ports = ControlPlanePorts {
            etcd: next_port(),
            etcd_peer: next_port(),
            apiserver: next_port(),
            controller_manager: next_port(),
            scheduler: next_port(),
        };
        let node_ports: Vec<NodePorts> = config
            .nodes
            .iter()
            .map(|_| NodePorts {
                kubelet: next_port(),
                healthz: next_port(),
            })
            .collect();

        let pki_dir = dir.path.join("pki");
        let authority = Authority::create(&pki_dir)?;
        let server = format!("https://127.0.0.1:{}", control_ports.apiserver);
        let admin = authority.issue(
            "admin",
            "kubernetes-admin",
            Some("system:masters"),
            Usage::Client,
        )?;
        let kubeconfig = dir.path.join("admin.kubeconfig");
        authority.kubeconfig(&kubeconfig, &server, "admin", &admin)?;

        let mut cluster = Self {
            control_plane: Mutex::new(ControlPlane::default()),
            nodes: Vec::new(),
            spawner: Spawner::new().map_err(io_error("starting the spawner thread"))?,
            authority,
            binaries,
            served: config.served,
            server,
            kubeconfig,
            namespaces: AtomicU32::new(0),
            dir,
        };
        let gates = feature_gates(&config.feature_gates);
        cluster
            .start_control_plane(&config, &control_ports, &gates)
            .await?;
        for (name, ports) in config.nodes.iter().zip(node_ports) {
            let node = KubeletNode::launch(&cluster, name, ports, &config.feature_gates)?;
            cluster.nodes.push(node);
        }
        let client = cluster.client().await?;
        for node in &cluster.nodes {
            node.wait_ready(&client, READY_TIMEOUT).await?;
        }
        if config.controller_manager {
            cluster
                .wait_for_service_account(&client, "default", READY_TIMEOUT)
                .await?;
        }
        Ok(cluster)
    }

    async fn start_control_plane(
        &self,
        config: &RealClusterBuilder,
        ports: &ControlPlanePorts,
        gates: &str,
    ) -> Result<(), E2eError> {
        let etcd_args = self.etcd_args(ports)?;
        let etcd = self.spawn("etcd", "etcd", &etcd_args)?;
        let etcd_health = SocketAddr::from((Ipv4Addr::LOCALHOST, ports.etcd));
        self.control_plane_mut(|cp| cp.etcd = Some(etcd));
        self.wait_control_plane(
            "etcd",
            "GET /health",
            |cp| cp.etcd.as_mut(),
            || http_get_ok(etcd_health, "/health"),
        )
        .await?;

        let serving = self.authority.issue(
            "apiserver",
            "kube-apiserver",
            None,
            Usage::Serving(&[
                "127.0.0.1",
                "localhost",
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]),
        )?;
        let kubelet_client = self.authority.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
            Usage::Client,
        )?;
        let sa = self.authority.service_account_keys()?;
        let ca = self.authority.ca_cert();
        let path = |p: &Path| p.display().to_string();
        let apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.apiserver),
            "--endpoint-reconciler-type=none".into(),
            format!("--tls-cert-file={}", path(&serving.cert)),
            format!("--tls-private-key-file={}", path(&serving.key)),
            format!("--client-ca-file={}", path(&ca)),
            format!(
                "--kubelet-client-certificate={}",
                path(&kubelet_client.cert)
            ),
            format!("--kubelet-client-key={}", path(&kubelet_client.key)),
            format!("--kubelet-certificate-authority={}", path(&ca)),
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            format!("--service-account-key-file={}", path(&sa.cert)),
            format!("--service-account-signing-key-file={}", path(&sa.key)),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--allow-privileged=true".into(),
            format!("--feature-gates={gates}"),
            format!("--runtime-config={}", self.served.runtime_config()),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        let apiserver = self.spawn("kube-apiserver", "kube-apiserver", &apiserver_args)?;
        self.control_plane_mut(|cp| cp.apiserver = Some(apiserver));
        let client = self.client().await?;
        // With resource.k8s.io/v1 off, /readyz never passes its informer-sync check (the Node
        // authorizer watches v1 ResourceSlices); every other check must pass.
        let readyz = if self.served.serves_v1() {
            "/readyz"
        } else {
            "/readyz?exclude=informer-sync"
        };
        self.wait_control_plane(
            "kube-apiserver",
            &format!("GET {readyz}"),
            |cp| cp.apiserver.as_mut(),
            || {
                let client = client.clone();
                async move {
                    let request = http::Request::get(readyz).body(Vec::new());
                    match request {
                        Ok(request) => client
                            .request_text(request)
                            .await
                            .is_ok_and(|text| text.trim() == "ok"),
                        Err(_) => false,
                    }
                }
            },
        )
        .await?;

        let mut started = Vec::new();
        if config.controller_manager {
            let mut args = self.control_loop_args(
                "kube-controller-manager",
                "system:kube-controller-manager",
                ports.controller_manager,
                gates,
            )?;
            args.extend([
                format!("--service-account-private-key-file={}", path(&sa.key)),
                format!("--root-ca-file={}", path(&ca)),
                "--use-service-account-credentials=true".into(),
                format!("--cluster-signing-cert-file={}", path(&ca)),
                format!(
                    "--cluster-signing-key-file={}",
                    path(&self.authority.ca_key())
                ),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--controllers=*".into(),
            ]);
            let process =
                self.spawn("kube-controller-manager", "kube-controller-manager", &args)?;
            self.control_plane_mut(|cp| cp.controller_manager = Some(process));
            started.push(("kube-controller-manager", ports.controller_manager));
        }
        if config.scheduler {
            let args = self.control_loop_args(
                "kube-scheduler",
                "system:kube-scheduler",
                ports.scheduler,
                gates,
            )?;
            let process = self.spawn("kube-scheduler", "kube-scheduler", &args)?;
            self.control_plane_mut(|cp| cp.scheduler = Some(process));
            started.push(("kube-scheduler", ports.scheduler));
        }
        for (name, port) in started {
            // Their health endpoints serve a self-signed certificate; that the secure port
            // accepts connections says the process is past start-up. What they do is awaited
            // through its effects (Nodes, ServiceAccounts, allocated claims).
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            self.wait_control_plane(
                name,
                &format!("a listener on {addr}"),
                |cp| match name {
                    "kube-scheduler" => cp.scheduler.as_mut(),
                    _ => cp.controller_manager.as_mut(),
                },
                || async move { tokio::net::TcpStream::connect(addr).await.is_ok() },
            )
            .await?;
        }
        Ok(())
    }

    /// The flags the controller manager and the scheduler share: their identity (a client
    /// certificate for `user`), where they serve, no leader election, the feature gates.
    fn control_loop_args(
        &self,
        name: &str,
        user: &str,
        port: u16,
        gates: &str,
    ) -> Result<Vec<String>, E2eError> {
        let cert = self.authority.issue(name, user, None, Usage::Client)?;
        let kubeconfig = self.component_kubeconfig(name, &cert)?;
        let serving = self.dir.path.join("pki").join(format!("{name}-serving"));
        Ok(vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", serving.display()),
            "--leader-elect=false".into(),
            format!("--feature-gates={gates}"),
            "--profiling=false".into(),
            "--v=1".into(),
        ])
    }

    fn etcd_args(&self, ports: &ControlPlanePorts) -> Result<Vec<String>, E2eError> {
        let data = self.dir.path.join("etcd").display().to_string();
        // An upstream etcd release takes the standard flags; an older build of this harness
        // shipped a small wrapper with flags of its own (`--client-port`), still accepted so
        // that a directory prepared for it keeps working. Ask the binary which it is.
        let help = std::process::Command::new(self.binaries.path("etcd"))
            .arg("--help")
            .output()
            .map_err(io_error("running etcd --help"))?;
        let help = format!(
            "{}{}",
            String::from_utf8_lossy(&help.stdout),
            String::from_utf8_lossy(&help.stderr)
        );
        Ok(if help.contains("client-port") {
            vec![
                "--data-dir".into(),
                data,
                "--client-port".into(),
                ports.etcd.to_string(),
                "--peer-port".into(),
                ports.etcd_peer.to_string(),
            ]
        } else {
            let client = format!("http://127.0.0.1:{}", ports.etcd);
            let peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
            vec![
                format!("--data-dir={data}"),
                format!("--listen-client-urls={client}"),
                format!("--advertise-client-urls={client}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=default={peer}"),
                "--unsafe-no-fsync".into(),
            ]
        })
    }

    fn component_kubeconfig(&self, name: &str, cert: &CertFiles) -> Result<String, E2eError> {
        let path = self.dir.path.join("pki").join(format!("{name}.kubeconfig"));
        self.authority.kubeconfig(&path, &self.server, name, cert)?;
        Ok(path.display().to_string())
    }

    fn control_plane_mut(&self, f: impl FnOnce(&mut ControlPlane)) {
        let mut guard = self
            .control_plane
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard);
    }

    /// Waits until `check` passes, failing early when the component exits.
    async fn wait_control_plane<C, F>(
        &self,
        component: &str,
        waiting_for: &str,
        mut process: impl FnMut(&mut ControlPlane) -> Option<&mut ManagedProcess>,
        check: C,
    ) -> Result<(), E2eError>
    where
        C: Fn() -> F,
        F: Future<Output = bool>,
    {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if check().await {
                return Ok(());
            }
            // The guard must not live across the await below (the future stays Send).
            let verdict = {
                let mut guard = self
                    .control_plane
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                match process(&mut guard) {
                    None => Some(Ok(())),
                    Some(proc) => {
                        if let Some(status) = proc.exited() {
                            Some(Err(E2eError::Exited {
                                component: component.to_owned(),
                                status,
                                log: proc.log_path().to_owned(),
                                tail: proc.log_tail(15),
                            }))
                        } else if Instant::now() > deadline {
                            Some(Err(E2eError::NotReady {
                                component: component.to_owned(),
                                waiting_for: waiting_for.to_owned(),
                                timeout: READY_TIMEOUT,
                                log: proc.log_path().to_owned(),
                                tail: proc.log_tail(15),
                            }))
                        } else {
                            None
                        }
                    }
                }
            };
            if let Some(verdict) = verdict {
                return verdict;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Starts `binary` as the component `name`, from an empty working directory of its own
    /// (a kubelet cleaning up container logs may delete files in its working directory), its
    /// output in `logs/<name>.log`.
    pub(crate) fn spawn(
        &self,
        name: &str,
        binary: &str,
        args: &[String],
    ) -> Result<ManagedProcess, E2eError> {
        self.spawn_program(name, &self.binaries.path(binary), args)
    }

    /// [`spawn`](Self::spawn) in a mount namespace of its own, with `mounts` private to it.
    pub(crate) fn spawn_with_mounts(
        &self,
        name: &str,
        binary: &str,
        args: &[String],
        mounts: &[PrivateMount],
    ) -> Result<ManagedProcess, E2eError> {
        self.start(name, &self.binaries.path(binary), args, mounts)
    }

    /// Starts any program (a driver's plugin binary, say) under the cluster's supervision: it
    /// is stopped when the returned handle or the cluster is dropped, and killed with the
    /// test process. Its output goes to `logs/<name>.log` in the cluster's folder.
    pub fn spawn_program(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
    ) -> Result<ManagedProcess, E2eError> {
        self.start(name, program, args, &[])
    }

    fn start(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        mounts: &[PrivateMount],
    ) -> Result<ManagedProcess, E2eError> {
        let work = self.dir.path.join("work").join(name);
        std::fs::create_dir_all(&work).map_err(io_error(format!("creating {}", work.display())))?;
        let log = self.log_path(name);
        self.spawner
            .spawn(name, program, args, &work, &log, mounts)
            .map_err(io_error(format!("starting {}", program.display())))
    }

    pub(crate) fn spawner(&self) -> &Spawner {
        &self.spawner
    }

    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The log file of a component: `etcd`, `kube-apiserver`, `kube-controller-manager`,
    /// `kube-scheduler`, `kubelet-<node>`, or a name given to
    /// [`spawn_program`](Self::spawn_program).
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.path.join("logs").join(format!("{component}.log"))
    }

    /// The cluster's folder: certificates, logs, kubelet directories.
    pub fn path(&self) -> &Path {
        &self.dir.path
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The versions of `resource.k8s.io` the API server serves.
    pub fn served_versions(&self) -> ServedVersions {
        self.served
    }

    /// A kubeconfig with cluster-admin rights (`system:masters`), for binaries under test.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Writes a kubeconfig for another identity: a client certificate for `user`, in `group`
    /// if given (e.g. `system:node:node-1` in `system:nodes`), to test what RBAC and admission
    /// allow.
    pub fn kubeconfig_for(&self, user: &str, group: Option<&str>) -> Result<PathBuf, E2eError> {
        let safe: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let cert = self
            .authority
            .issue(&format!("user-{safe}"), user, group, Usage::Client)?;
        let path = self.dir.path.join(format!("{safe}.kubeconfig"));
        self.authority
            .kubeconfig(&path, &self.server, &safe, &cert)?;
        Ok(path)
    }

    /// A new cluster-admin client of the API server, on the caller's runtime.
    pub async fn client(&self) -> Result<kube::Client, E2eError> {
        client_from(&self.kubeconfig).await
    }

    /// The nodes, in the order they were configured.
    pub fn nodes(&self) -> &[KubeletNode] {
        &self.nodes
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&KubeletNode, E2eError> {
        self.nodes
            .iter()
            .find(|node| node.name() == name)
            .ok_or_else(|| E2eError::UnknownNode(name.to_owned()))
    }

    /// A plugin builder wired to `node`: its kubelet's registry and plugins directories, its
    /// CDI directory, its name, the given API client.
    pub fn plugin<D: Driver>(
        &self,
        node: &str,
        driver: D,
        driver_name: &str,
        client: kube::Client,
    ) -> Result<PluginBuilder<D>, E2eError> {
        let node = self.node(node)?;
        Ok(
            KubeletPlugin::builder(driver, driver_name, node.name(), client)
                .registrar_dir(node.registrar_dir())
                .plugins_dir(node.plugins_dir())
                .cdi_root(node.cdi_root()),
        )
    }

    /// Restarts a node's kubelet (stop, start, wait for its `/healthz`).
    pub async fn restart_kubelet(&self, node: &str) -> Result<(), E2eError> {
        self.node(node)?.restart_kubelet(self).await
    }

    /// Creates a namespace named `<prefix>-<n>` and waits for its `default` ServiceAccount,
    /// without which pods are refused. Tests sharing a cluster each take their own.
    pub async fn create_namespace(&self, prefix: &str) -> Result<String, E2eError> {
        let name = format!(
            "{prefix}-{}",
            self.namespaces.fetch_add(1, Ordering::Relaxed)
        );
        let client = self.client().await?;
        let namespace: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name },
        }))
        .map_err(|error| io_error("building a Namespace")(std::io::Error::other(error)))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(api_error(format!("create Namespace {name}")))?;
        self.wait_for_service_account(&client, &name, Duration::from_secs(30))
            .await?;
        Ok(name)
    }

    async fn wait_for_service_account(
        &self,
        client: &kube::Client,
        namespace: &str,
        timeout: Duration,
    ) -> Result<(), E2eError> {
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = accounts.get_opt("default").await {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
        Err(E2eError::Timeout {
            what: format!("ServiceAccount {namespace}/default (kube-controller-manager)"),
            timeout,
        })
    }

    /// The process IDs of the running components, by component name.
    pub fn pids(&self) -> Vec<(String, u32)> {
        let mut pids = Vec::new();
        {
            let control_plane = self
                .control_plane
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for process in [
                &control_plane.etcd,
                &control_plane.apiserver,
                &control_plane.controller_manager,
                &control_plane.scheduler,
            ]
            .into_iter()
            .flatten()
            {
                if let Some(pid) = process.pid() {
                    pids.push((process.name().to_owned(), pid));
                }
            }
        }
        for node in &self.nodes {
            pids.extend(node.pids());
        }
        pids
    }

    /// A one-line summary of where things are, for test output.
    pub fn describe(&self) -> String {
        let mut text = format!("cluster {} in {}", self.server, self.dir.path.display());
        for node in &self.nodes {
            let _ = write!(
                text,
                "; node {} (kubelet root {})",
                node.name(),
                node.root_dir().display()
            );
        }
        text
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.stop();
        }
        let mut control_plane = self
            .control_plane
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for process in [
            control_plane.scheduler.take(),
            control_plane.controller_manager.take(),
            control_plane.apiserver.take(),
            control_plane.etcd.take(),
        ]
        .into_iter()
        .flatten()
        {
            drop(process);
        }
    }
}

/// A client from a kubeconfig file.
pub(crate) async fn client_from(kubeconfig: &Path) -> Result<kube::Client, E2eError> {
    let error = |message: String| E2eError::Client {
        kubeconfig: kubeconfig.to_owned(),
        message,
    };
    let file = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| error(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .map_err(|e| error(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| error(e.to_string()))
}

fn feature_gates(gates: &[(String, bool)]) -> String {
    gates
        .iter()
        .map(|(gate, on)| format!("{gate}={on}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `count` distinct free loopback ports: all bound at once, then released.
fn free_ports(count: usize) -> Result<Vec<u16>, E2eError> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_error("finding free loopback ports"))?;
    listeners
        .iter()
        .map(|listener| listener.local_addr().map(|addr| addr.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_error("finding free loopback ports"))
}

/// A plain-HTTP GET that answers 200.
pub(crate) async fn http_get_ok(addr: SocketAddr, path: &str) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let response = String::from_utf8_lossy(&response);
        Some(response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Removes folders of clusters whose test process is gone (clusters kept in a `static` are
/// never dropped, and a killed test drops nothing).
fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            remove_cluster_dir(&entry.path());
        }
    }
}

/// Removes a cluster folder, unmounting first whatever a kubelet mounted under it (volumes of
/// pods that were running when it stopped).
fn remove_cluster_dir(dir: &Path) {
    if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| Path::new(point).starts_with(dir))
            .collect();
        // Deepest first.
        points.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in points {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(point)
                .status();
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

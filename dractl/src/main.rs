//! `dractl`: look at and poke a DRA kubelet plugin from a shell, the way the kubelet does.
//!
//! Install with `cargo install --path dractl` from a checkout. See `docs/dractl.md`.
//!
//! Exit codes: 0 when the command did what was asked and the checked thing is fine; 1 when the
//! checked thing failed (a claim did not prepare, a slice is invalid, a conformance case
//! failed); 2 for usage errors and when the plugin or the API server cannot be reached.

mod cluster;
mod explain;
mod objects;
mod plugin;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "dractl",
    version,
    about = "Look at and poke DRA kubelet plugins the way the kubelet does",
    after_help = "Exit codes: 0 success, 1 the checked thing failed, 2 usage or connection error."
)]
struct Cli {
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,

    /// Log what dractl and the SDK do to stderr (RUST_LOG overrides).
    #[arg(short, long, global = true)]
    verbose: bool,

    #[command(subcommand)]
    command: Command,
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Aligned text for people.
    Table,
    /// JSON for programs (one object; `health` prints one object per line).
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a plugin tells the kubelet on registration, and which API each kubelet
    /// release would use.
    Info {
        /// The plugin's registration socket.
        socket: PathBuf,
    },
    /// Prepare a claim, as the kubelet does before a pod using it starts.
    Prepare {
        #[command(flatten)]
        claim: ClaimArgs,
        /// Allocate the claim first if it is not allocated, with the SDK's allocator (for
        /// clusters without a scheduler, such as the SDK's embedded test cluster).
        #[arg(long)]
        allocate: bool,
        /// Node to allocate on; default: the node of the driver's ResourceSlices.
        #[arg(long, requires = "allocate")]
        node: Option<String>,
    },
    /// Unprepare a claim, as the kubelet does after the last pod using it ended.
    Unprepare {
        #[command(flatten)]
        claim: ClaimArgs,
    },
    /// Stream device health as the kubelet receives it (Ctrl-C stops).
    Health {
        /// The plugin's registration socket.
        socket: PathBuf,
        /// Stop after this many device lists.
        #[arg(long)]
        count: Option<usize>,
        /// Give up after this many seconds; without --count, stop then.
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// Pretty-print the ResourceSlices drivers publish and check them against the API
    /// server's limits.
    Slices {
        #[command(flatten)]
        api: ApiArgs,
        /// Only this driver's slices.
        #[arg(long)]
        driver: Option<String>,
        /// Only slices of this node (and slices without a node).
        #[arg(long)]
        node: Option<String>,
    },
    /// Explain why a claim can or cannot be allocated, device by device, and what it would
    /// get (or, with only --node, what holds the node's devices). Read-only.
    #[command(
        after_help = "Exit codes: 0 allocatable (or allocated; always for --node alone), \
        1 not allocatable, 2 usage, file or connection error."
    )]
    Explain {
        /// The claim, as NAMESPACE/NAME (with -f: picks a claim or template of the file by
        /// name).
        claim: Option<String>,
        /// A file with the ResourceClaim or ResourceClaimTemplate to explain (`-` for stdin).
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: Option<PathBuf>,
        /// Explain for this node only; without a claim, list the node's devices and what
        /// holds them.
        #[arg(long)]
        node: Option<String>,
        /// ResourceSlices from these YAML/JSON files or directories instead of the cluster
        /// (repeatable). Any of --slices, --classes, --claims, --nodes reads nothing from the
        /// cluster.
        #[arg(long, value_name = "FILE_OR_DIR")]
        slices: Vec<PathBuf>,
        /// DeviceClasses from these files or directories (repeatable).
        #[arg(long, value_name = "FILE_OR_DIR")]
        classes: Vec<PathBuf>,
        /// ResourceClaims (the allocated ones hold devices) from these files or directories
        /// (repeatable).
        #[arg(long, value_name = "FILE_OR_DIR")]
        claims: Vec<PathBuf>,
        /// Nodes (for their labels) from these files or directories (repeatable).
        #[arg(long, value_name = "FILE_OR_DIR")]
        nodes: Vec<PathBuf>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Run the conformance suite against a running plugin.
    Conformance {
        /// The plugin's registration socket (not needed with --list).
        #[arg(required_unless_present = "list")]
        socket: Option<PathBuf>,
        #[command(flatten)]
        api: ApiArgs,
        /// The plugin's node; default: the node of the driver's ResourceSlices.
        #[arg(long)]
        node: Option<String>,
        /// Where the plugin writes CDI specs; without it the CDI cases are skipped.
        #[arg(long)]
        cdi_root: Option<PathBuf>,
        /// Namespace for the claims the suite creates.
        #[arg(long, default_value = dra_sdk_testing::conformance::DEFAULT_NAMESPACE)]
        namespace: String,
        /// Run only this case (repeatable).
        #[arg(long = "case", value_name = "CASE")]
        cases: Vec<String>,
        /// Leave this case out (repeatable).
        #[arg(long = "skip", value_name = "CASE")]
        skipped: Vec<String>,
        /// List the cases and exit.
        #[arg(long)]
        list: bool,
    },
}

/// Access to the API server.
#[derive(Args)]
struct ApiArgs {
    /// Kubeconfig of the plugin's API server; default: $KUBECONFIG, ~/.kube/config or the
    /// in-cluster configuration.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

impl ApiArgs {
    /// A client from --kubeconfig, or from the usual places.
    async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .with_context(|| format!("loading kubeconfig {}", path.display()))?
            }
            None => kube::Config::infer()
                .await
                .context("no --kubeconfig, and no kubeconfig or in-cluster configuration found")?,
        };
        kube::Client::try_from(config).context("creating the API client")
    }

    /// A client only when one was asked for: --kubeconfig or $KUBECONFIG.
    async fn optional_client(&self) -> anyhow::Result<Option<kube::Client>> {
        if self.kubeconfig.is_some() || std::env::var_os("KUBECONFIG").is_some() {
            self.client().await.map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Which claim, and how to reach the plugin and the API.
#[derive(Args)]
struct ClaimArgs {
    /// The plugin's registration socket.
    socket: PathBuf,
    /// The claim, as NAMESPACE/NAME.
    claim: String,
    /// The claim's UID; without it, dractl reads it from the API server.
    #[arg(long)]
    uid: Option<String>,
    #[command(flatten)]
    api: ApiArgs,
    /// DRA API version to call; default: what a 1.36 kubelet picks.
    #[arg(long, value_enum)]
    api_version: Option<ApiVersion>,
}

/// The DRA node API versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ApiVersion {
    /// `v1.DRAPlugin`.
    V1,
    /// `v1beta1.DRAPlugin`.
    V1beta1,
}

/// How a command ended when it could do its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Everything fine: exit 0.
    Ok,
    /// The checked thing failed: exit 1.
    Failed,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("dractl: starting the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(Status::Ok) => ExitCode::SUCCESS,
        Ok(Status::Failed) => ExitCode::from(1),
        Err(error) => {
            eprintln!("dractl: {}", describe(&error));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, leaving out causes that an outer message already
/// quotes (the SDK's errors include their source in their message).
fn describe(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

fn init_logging(verbose: bool) {
    let default = if verbose { "debug" } else { "off" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only on a terminal (and not with NO_COLOR): a captured stderr gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
}

async fn run(cli: Cli) -> anyhow::Result<Status> {
    let output = cli.output;
    match cli.command {
        Command::Info { socket } => plugin::info(&socket, output).await,
        Command::Prepare {
            claim,
            allocate,
            node,
        } => {
            let allocate = allocate.then_some(node);
            plugin::prepare(&claim, allocate, output).await
        }
        Command::Unprepare { claim } => plugin::unprepare(&claim, output).await,
        Command::Health {
            socket,
            count,
            timeout,
        } => plugin::health(&socket, count, timeout, output).await,
        Command::Slices { api, driver, node } => {
            let client = api.client().await?;
            cluster::slices(&client, driver.as_deref(), node.as_deref(), output).await
        }
        Command::Explain {
            claim,
            file,
            node,
            slices,
            classes,
            claims,
            nodes,
            api,
        } => {
            let args = explain::ExplainArgs {
                claim,
                file,
                node,
                slices,
                classes,
                claims,
                nodes,
                api,
            };
            explain::explain(args, output).await
        }
        Command::Conformance {
            socket,
            api,
            node,
            cdi_root,
            namespace,
            cases,
            skipped,
            list,
        } => {
            if list {
                return Ok(cluster::list_cases(output));
            }
            let socket = socket.context("the registration socket is required")?;
            let settings = cluster::SuiteSettings {
                socket,
                client: api.optional_client().await?,
                node,
                cdi_root,
                namespace,
                cases,
                skipped,
            };
            cluster::conformance(settings, output).await
        }
    }
}

/// Prints a value as pretty JSON.
fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(value).context("encoding the output as JSON")?
    );
    Ok(())
}

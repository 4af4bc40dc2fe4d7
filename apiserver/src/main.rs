//! `elemental-changelog-apiserver`: serves Elemental OS changelogs through the
//! Kubernetes aggregation layer; `inspect` and `compute` help channel builders.

use std::{path::Path, process::ExitCode, sync::Arc};

use anyhow::{Context as _, Result};
use clap::Parser;
use elemental_changelog_apiserver::{
    cache::Cache,
    channels::{
        self, RefreshSettings,
        history::{ConfigMapHistory, HistoryMetrics},
    },
    cli,
    config::{Cli, Command, ServeArgs},
    health::Health,
    metrics::Registry,
    projectors::{MachineProjector, Projectors, VersionProjector},
    reflect::WatchMetrics,
    routes::{
        App, fleet::FleetView, metrics::AuthCounts, ready::ReadyCache, resources::Resources,
        watch::WatchSlots,
    },
    server, telemetry,
    versions::VersionData,
};
use elemental_changelog_auth::{authn::Authenticator, authz::Authorizer};
use elemental_changelog_certs::{serving, tls};
use elemental_changelog_registry::{ReloadingFetcher, reload};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Both kube and oci-client build rustls clients; they use this provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("elemental-changelog-apiserver: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Some(Command::Inspect(args)) => cli::inspect(*args).await.map_err(anyhow::Error::from),
            Some(Command::Compute(args)) => cli::compute(&args).map_err(anyhow::Error::from),
            None => serve(cli.serve).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line that names what failed and why, for people and for
            // `kubectl logs` alike.
            eprintln!("elemental-changelog-apiserver: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    telemetry::init(args.log_format);
    check_default_arch(&args)?;
    // Each part registers what it counts here; `/metrics` shows them all.
    let registry = Registry::default();
    let watches: Arc<WatchMetrics> = registry.register();
    let health = Arc::new(Health::default());
    let resolver = certificate_resolver(&args)?;
    let tls_config = Arc::new(tls::server_config(resolver.clone()).context("TLS configuration")?);
    let client = kube_client(args.kubeconfig.as_deref()).await?;

    let fetcher = Arc::new(ReloadingFetcher::new(
        args.registry.clone(),
        channels::CHANNEL_FILES,
    )?);
    let registry_run = reload_registry_settings(fetcher.clone());
    let cache = Arc::new(Cache::default());
    let (channel_stores, channels_run) = channels::start(
        client.clone(),
        &args.namespaces,
        fetcher,
        cache.clone(),
        registry.register(),
        &watches,
        &health,
        refresh_settings(&args, &client, &registry, &watches, &health),
    );
    // The fleet view's reflectors run (and stop) with the channel reflectors.
    let (fleet_stores, fleet_run) = elemental_changelog_apiserver::fleet::reflect::start(
        &client,
        &args.namespaces,
        &watches,
        &health,
    );
    let channels_run = async move {
        futures::future::select(channels_run, fleet_run).await;
    };
    let (authn, authn_run, authz) = auth(&args, client, &registry, watches, &health);
    let (projectors, writers) = Projectors::new(
        &args.architectures,
        elemental_changelog_hub::Bounds {
            ring_bytes: usize::try_from(args.serving.watch_cache_size).unwrap_or(usize::MAX),
        },
    );
    let data = VersionData {
        stores: channel_stores.clone(),
        cache: cache.clone(),
    };
    let resources = Arc::new(Resources::new(
        channel_stores,
        cache,
        args.default_arch.clone(),
        args.architectures.clone(),
        ReadyCache::new(args.serving.answer_cache_size, registry.register()),
        projectors.clone(),
    ));
    let fleet = Arc::new(FleetView::new(
        fleet_stores.clone(),
        Arc::new(resources.clone()),
        projectors.clone(),
    ));
    let default_arch = resources.served_arch(None).ok();
    let versions = VersionProjector::new(writers.versions, data.clone());
    let machines = MachineProjector::new(
        writers.machines,
        data,
        fleet_stores,
        projectors.summaries().clone(),
        registry.register(),
        default_arch,
    );
    let live_run = keep_answers(&projectors, versions, machines, &health);
    let certs_run = server::reload_certificates(resolver, registry.register());
    let app = app(
        &args,
        registry,
        health.clone(),
        authn,
        authz,
        resources,
        fleet,
    );
    let listener = listen(&args).await?;
    let shutdown = shutdown(health, args.serving.shutdown_delay_duration);
    let defaults = app.clone().keep_defaults_ready();
    let defaults_run = async move {
        futures::future::select(Box::pin(defaults), Box::pin(live_run)).await;
    };
    let server = server::serve(listener, tls_config, app, shutdown, &args.serving);
    let loops = Loops {
        channels_run,
        authn_run,
        certs_run,
        registry_run,
        defaults_run,
    };
    supervise(server, loops).await
}

/// The socket `--bind-address` and `--secure-port` name, listening.
async fn listen(args: &ServeArgs) -> Result<tokio::net::TcpListener> {
    let addr = std::net::SocketAddr::new(args.bind_address, args.secure_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    info!(%addr, version = env!("CARGO_PKG_VERSION"), "serving");
    Ok(listener)
}

/// The server's request handler over its parts, bounded by the serving flags.
fn app(
    args: &ServeArgs,
    registry: Registry,
    health: Arc<Health>,
    authn: Arc<Authenticator>,
    authz: Arc<Authorizer>,
    resources: Arc<Resources>,
    fleet: Arc<FleetView>,
) -> Arc<App> {
    Arc::new(App {
        metrics: registry.register(),
        registry,
        health,
        authn,
        authz,
        resources,
        fleet,
        inflight: Arc::new(Semaphore::new(args.serving.max_requests_inflight)),
        watches: WatchSlots::new(args.serving.max_watches, args.serving.max_watches_per_user),
        compute: Arc::new(Semaphore::new(compute_slots(
            args.serving.max_compute_concurrency,
        ))),
        request_timeout: args.serving.request_timeout,
        access_log: args.access_log,
    })
}

/// Keeps the version and machine answers current (the projectors); never ends.
fn keep_answers(
    projectors: &Arc<Projectors>,
    versions: VersionProjector,
    machines: MachineProjector,
    health: &Health,
) -> impl Future<Output = ()> + use<> {
    let versions = projectors
        .clone()
        .keep_versions(versions, health.ready_flag("version-summaries"));
    let machines = projectors
        .clone()
        .keep_machines(machines, health.ready_flag("machine-summaries"));
    async move {
        futures::future::select(Box::pin(versions), Box::pin(machines)).await;
    }
}

/// Delegated authentication (whose configuration `authn_run` watches) and authorization,
/// counting in `registry`.
fn auth(
    args: &ServeArgs,
    client: kube::Client,
    registry: &Registry,
    watches: Arc<WatchMetrics>,
    health: &Health,
) -> (
    Arc<Authenticator>,
    impl Future<Output = ()> + use<>,
    Arc<Authorizer>,
) {
    let auth_metrics = Arc::new(AuthCounts::new(registry, watches));
    let authn = Arc::new(Authenticator::new(
        client.clone(),
        &args.authn,
        auth_metrics.clone(),
    ));
    let auth_ready = health.ready_flag("authentication-config");
    let authn_run = authn.clone().run(move || auth_ready.set());
    let authz = Arc::new(Authorizer::new(client, &args.authz, auth_metrics));
    (authn, authn_run, authz)
}

/// Runs the server and the loops that keep its inputs current until the server
/// stops; a loop that stops first is an error.
async fn supervise<C, A, T, R, D>(
    server: impl Future<Output = ()>,
    loops: Loops<C, A, T, R, D>,
) -> Result<()>
where
    C: Future<Output = ()>,
    A: Future<Output = ()>,
    T: Future<Output = ()>,
    R: Future<Output = ()>,
    D: Future<Output = ()>,
{
    let Loops {
        channels_run,
        authn_run,
        certs_run,
        registry_run,
        defaults_run,
    } = loops;
    tokio::select! {
        () = server => {
            info!("stopped");
            Ok(())
        }
        () = channels_run => {
            error!("the channel controller stopped");
            anyhow::bail!("the channel controller stopped")
        }
        () = authn_run => {
            error!("the authentication configuration watch stopped");
            anyhow::bail!("the authentication configuration watch stopped")
        }
        () = certs_run => anyhow::bail!("the serving certificate reloader stopped"),
        () = registry_run => anyhow::bail!("the registry settings reloader stopped"),
        () = defaults_run => anyhow::bail!("the renderer of default answers stopped"),
    }
}

/// The loops that run next to the server for as long as it serves.
struct Loops<C, A, T, R, D> {
    /// Reflectors and channel workers.
    channels_run: C,
    /// The authentication configuration watch.
    authn_run: A,
    /// The serving certificate reloader.
    certs_run: T,
    /// The registry settings reloader.
    registry_run: R,
    /// The renderer of default answers.
    defaults_run: D,
}

/// `--default-arch` must be one of `--architecture`.
fn check_default_arch(args: &ServeArgs) -> Result<()> {
    anyhow::ensure!(
        args.architectures.contains(&args.default_arch),
        "--default-arch {} is not one of --architecture {}",
        args.default_arch,
        args.architectures
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    Ok(())
}

/// The serving certificate: the files given, else a self-signed one.
fn certificate_resolver(args: &ServeArgs) -> Result<Arc<serving::ReloadingResolver>> {
    let source = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => serving::CertSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => serving::CertSource::SelfSigned {
            dir: args.cert_dir.clone(),
            hosts: args.self_signed_hosts.clone(),
        },
    };
    let files = source.prepare().context("serving certificate")?;
    Ok(Arc::new(
        serving::ReloadingResolver::new(files).context("serving certificate")?,
    ))
}

/// The Kubernetes client: from `--kubeconfig`, else as kubectl finds one.
async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    let kube_config = match kubeconfig {
        Some(path) => {
            // kube's errors repeat their source and quote YAML snippets over
            // several lines; the first line says it all.
            let first_line = |e: &dyn std::fmt::Display| e.to_string().lines().next().unwrap_or_default().to_owned();
            let text = std::fs::read_to_string(path).with_context(|| format!("kubeconfig {}", path.display()))?;
            let kubeconfig = Kubeconfig::from_yaml(&text)
                .map_err(|e| anyhow::anyhow!("kubeconfig {}: {}", path.display(), first_line(&e)))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| anyhow::anyhow!("kubeconfig {}: {}", path.display(), first_line(&e)))?
        }
        None => kube::Config::infer().await.context("no kubeconfig: neither --kubeconfig, $KUBECONFIG, ~/.kube/config nor in-cluster configuration")?,
    };
    kube::Client::try_from(kube_config).context("Kubernetes client")
}

/// Where the channel history is kept: a ConfigMap in `--history-namespace`,
/// else, in a pod, in the service account's namespace, else nowhere.
/// Logged at start, shown in `/readyz?verbose` (`channel-history`, or
/// `channel-history-off`) and in `elemental_changelog_channel_history_enabled`.
/// The channel controller's settings, from the flags; with the channel history when enabled.
fn refresh_settings(
    args: &ServeArgs,
    client: &kube::Client,
    registry: &Registry,
    watches: &Arc<WatchMetrics>,
    health: &Health,
) -> RefreshSettings {
    RefreshSettings {
        interval: args.refresh_interval,
        architectures: args.architectures.clone(),
        history: history(args, client, registry, watches, health),
        max_kept_total: args.max_kept_total,
    }
}

fn history(
    args: &ServeArgs,
    client: &kube::Client,
    registry: &Registry,
    watches: &Arc<WatchMetrics>,
    health: &Health,
) -> Option<Arc<ConfigMapHistory>> {
    let metrics: Arc<HistoryMetrics> = registry.register();
    let found = match &args.history_namespace {
        Some(namespace) => Some((namespace.clone(), "--history-namespace (POD_NAMESPACE)")),
        None => default_history_namespace(args.kubeconfig.as_deref()),
    };
    metrics.history_enabled(found.is_some());
    let Some((namespace, source)) = found else {
        warn!(
            "channel history off: no --history-namespace (POD_NAMESPACE) and not running in a pod; retained versions live only in this replica's memory"
        );
        health.ready_flag("channel-history-off").set();
        return None;
    };
    info!(%namespace, configmap = %args.history_configmap, source, "channel history kept in the cluster");
    Some(Arc::new(ConfigMapHistory::new(
        client.clone(),
        &namespace,
        &args.history_configmap,
        metrics,
        watches.clone(),
    )))
}

/// The in-cluster service account's namespace, the namespace client-go uses in a pod,
/// when the client is in-cluster (no `--kubeconfig`, `$KUBECONFIG` or `~/.kube/config`,
/// the order of `kube::Config::infer`). From a kubeconfig there is no default: its
/// context's namespace (often `default`) is where the user works, not where this server
/// may keep its history, and a history it cannot read holds readiness back.
fn default_history_namespace(kubeconfig: Option<&Path>) -> Option<(String, &'static str)> {
    const SERVICE_ACCOUNT_NAMESPACE: &str =
        "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
    if kubeconfig.is_some() || Kubeconfig::read().is_ok() {
        return None;
    }
    std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
        .ok()
        .map(|namespace| namespace.trim().to_owned())
        .filter(|namespace| !namespace.is_empty())
        .map(|namespace| (namespace, "in-cluster service account"))
}

/// Re-reads the registry credential and CA files every
/// [`reload::DEFAULT_RELOAD_INTERVAL`], installing a new fetcher when they
/// changed; an unusable change is logged and the current settings kept.
/// Never completes.
async fn reload_registry_settings(fetcher: Arc<ReloadingFetcher>) {
    let interval = reload::DEFAULT_RELOAD_INTERVAL;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match fetcher.reload() {
            Ok(true) => info!("registry credentials or CA bundle changed: reloaded"),
            Ok(false) => {}
            Err(error) => {
                warn!(error = %telemetry::error_chain(&error), "registry settings changed but are unusable; keeping the current ones");
            }
        }
    }
}

/// Completes when the server should stop accepting: after SIGTERM or SIGINT
/// and the shutdown delay.
async fn shutdown(health: Arc<Health>, delay: std::time::Duration) {
    shutdown_signal().await;
    // Not ready first, then keep serving while endpoints drop this replica,
    // then stop accepting and drain (kube-apiserver's order).
    health.shut_down();
    info!(delay = ?delay, "readiness failing; serving until the shutdown delay ends");
    tokio::time::sleep(delay).await;
}

/// `--max-compute-concurrency`, with 0 meaning one slot per CPU.
fn compute_slots(configured: usize) -> usize {
    if configured > 0 {
        configured
    } else {
        std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
    }
}

/// Completes on SIGTERM (Kubernetes) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = term => info!("SIGTERM received"),
        r = tokio::signal::ctrl_c() => {
            if r.is_ok() {
                info!("SIGINT received");
            }
        }
    }
}

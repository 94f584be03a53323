//! The connection to the API server: the client configuration from the
//! kubeconfig `--k8s-kubeconfig-path` names, or in-cluster, and the client.

use std::path::PathBuf;

/// Why there is no client.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("--k8s-kubeconfig-path {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("in-cluster Kubernetes configuration (KUBERNETES_SERVICE_HOST is set): {0}")]
    InCluster(#[source] kube::config::InClusterError),
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// The client configuration from the kubeconfig at `kubeconfig`, or in-cluster.
pub async fn kube_config(kubeconfig: Option<&PathBuf>) -> Result<kube::Config, ConnectError> {
    match kubeconfig {
        Some(path) => {
            let at = |source| ConnectError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(at)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(at)
        }
        None => kube::Config::incluster().map_err(ConnectError::InCluster),
    }
}

/// Connects to the API server named by the kubeconfig (or in-cluster).
pub async fn connect(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, ConnectError> {
    let config = kube_config(kubeconfig).await?;
    kube::Client::try_from(config).map_err(ConnectError::Client)
}

/// The API server's URL, or why it is not known (for status).
pub async fn api_server_url(kubeconfig: Option<&PathBuf>) -> String {
    match kube_config(kubeconfig).await {
        Ok(c) => c.cluster_url.to_string(),
        Err(e) => e.to_string(),
    }
}

/// A kubeconfig at `dir/kubeconfig` naming an API server on a local port nothing
/// listens on, and the port (tests of what a command says when it cannot
/// connect).
#[cfg(test)]
pub fn unreachable_kubeconfig(dir: &std::path::Path) -> (PathBuf, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
        ),
    )
    .expect("writing the kubeconfig");
    (kubeconfig, port)
}

/// Connects, trying again every `every` until the API server answers; the
/// first failure is logged once, as `who` (a loop's name) cannot reach it yet.
pub async fn connect_retrying(
    kubeconfig: Option<&PathBuf>,
    who: &str,
    every: std::time::Duration,
) -> kube::Client {
    let mut logged = false;
    loop {
        match connect(kubeconfig).await {
            Ok(c) => return c,
            Err(e) if !logged => {
                tracing::warn!(error = %e, "{who}: cannot reach the API server yet; retrying");
                logged = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(every).await;
    }
}

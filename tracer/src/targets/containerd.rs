//! containerd's own API (gRPC on its socket): the labels of a container by
//! id. Kubernetes' CRI puts the pod's name and namespace and the container's
//! name on every container it creates as containerd labels
//! (`io.kubernetes.pod.name`, ...), in containerd's "k8s.io" namespace.
//!
//! The two calls used are written out as `prost` messages with containerd's
//! field numbers (api/services/containers/v1, namespaces/v1); tonic carries
//! them. Fields not declared here are skipped by the decoder.

use std::{collections::HashMap, path::PathBuf, time::Duration};

use anyhow::Context as _;
use tonic::{
    Code, Request,
    client::Grpc,
    codegen::http::uri::PathAndQuery,
    transport::{Channel, Endpoint},
};
use tonic_prost::ProstCodec;

use super::container_names::Runtime;
use crate::model::labels::ContainerNames;

/// Where containerd listens on a host by default.
pub const DEFAULT_SOCKET: &str = "/run/containerd/containerd.sock";

/// The namespace Kubernetes' containers live in: asked first.
const KUBERNETES_NAMESPACE: &str = "k8s.io";

/// Longest wait for one call: a runtime that does not answer costs a process
/// its names, not the agent its progress.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, PartialEq, prost::Message)]
struct GetContainerRequest {
    #[prost(string, tag = "1")]
    id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetContainerResponse {
    #[prost(message, optional, tag = "1")]
    container: Option<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Container {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(map = "string, string", tag = "2")]
    labels: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListNamespacesRequest {
    #[prost(string, tag = "1")]
    filter: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListNamespacesResponse {
    #[prost(message, repeated, tag = "1")]
    namespaces: Vec<Namespace>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Namespace {
    #[prost(string, tag = "1")]
    name: String,
}

/// A containerd reached on its socket, connected when first asked (and
/// again after a failure: containerd may start after the agent).
pub struct Containerd {
    socket: PathBuf,
    runtime: tokio::runtime::Runtime,
    channel: Option<Channel>,
}

impl Containerd {
    pub fn new(socket: PathBuf) -> anyhow::Result<Containerd> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the containerd client's runtime")?;
        Ok(Containerd {
            socket,
            runtime,
            channel: None,
        })
    }

    async fn connect(socket: PathBuf) -> anyhow::Result<Channel> {
        // The URI is not used: every connection is the socket.
        Endpoint::from_static("http://containerd")
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .context("connecting")
    }

    async fn labels(channel: Channel, id: &str) -> anyhow::Result<Option<HashMap<String, String>>> {
        let mut grpc = Grpc::new(channel);
        // Kubernetes' namespace first; the others are listed only for a
        // container that is not there (one call, not two, on a node).
        let mut namespaces = vec![KUBERNETES_NAMESPACE.to_owned()];
        let mut listed = false;
        while let Some(ns) = namespaces.pop() {
            let mut request = Request::new(GetContainerRequest { id: id.to_owned() });
            request
                .metadata_mut()
                .insert("containerd-namespace", ns.parse()?);
            grpc.ready().await?;
            let got = grpc
                .unary(
                    request,
                    PathAndQuery::from_static("/containerd.services.containers.v1.Containers/Get"),
                    ProstCodec::<GetContainerRequest, GetContainerResponse>::default(),
                )
                .await;
            match got {
                Ok(r) => return Ok(r.into_inner().container.map(|c| c.labels)),
                Err(s) if s.code() == Code::NotFound => {}
                Err(s) => return Err(s).with_context(|| format!("in namespace {ns}")),
            }
            if !listed {
                listed = true;
                grpc.ready().await?;
                let all = grpc
                    .unary(
                        Request::new(ListNamespacesRequest::default()),
                        PathAndQuery::from_static(
                            "/containerd.services.namespaces.v1.Namespaces/List",
                        ),
                        ProstCodec::<ListNamespacesRequest, ListNamespacesResponse>::default(),
                    )
                    .await
                    .context("listing namespaces")?;
                namespaces.extend(
                    all.into_inner()
                        .namespaces
                        .into_iter()
                        .map(|n| n.name)
                        .filter(|n| n != KUBERNETES_NAMESPACE),
                );
            }
        }
        Ok(None)
    }
}

impl Runtime for Containerd {
    fn names(&mut self, id: &str) -> anyhow::Result<Option<ContainerNames>> {
        let channel = match &self.channel {
            Some(c) => c.clone(),
            None => {
                let c = self.runtime.block_on(Self::connect(self.socket.clone()))?;
                self.channel = Some(c.clone());
                c
            }
        };
        let labels = self.runtime.block_on(Self::labels(channel, id));
        if labels.is_err() {
            self.channel = None;
        }
        Ok(labels?.and_then(|l| {
            ContainerNames::from_labels(l.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        }))
    }

    fn describe(&self) -> String {
        format!("containerd at {}", self.socket.display())
    }
}

//! gRPC adapters: the kubelet's DRA node service in v1 and v1beta1, and the health stream in
//! v1 and v1alpha1.
//!
//! Both API versions carry the same messages (v1 adds `share_id`), so one macro generates the
//! two adapters and both call the same [`NodeService`]. Conversion happens here, at the edge.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::Stream;
use tonic::{Request, Response, Status};

use crate::claim::wire::split_valid;
use crate::claim::{ClaimRef, DeviceRef};
use crate::driver::Driver;
use crate::health::{DeviceState, HealthSource, HealthStatus};
use crate::plugin::events::{ClaimEvents, Failure};
use crate::plugin::node::NodeService;
use crate::proto::health_v1;
use crate::proto::health_v1alpha1 as health_pb;

/// The kubelet's claims as [`ClaimRef`]s (the `Claim` message is the same in every version),
/// unchecked: [`split_valid`] refuses the ones whose fields cannot be used.
macro_rules! claim_refs {
    ($claims:expr) => {
        $claims
            .into_iter()
            .map(|claim| ClaimRef {
                uid: claim.uid,
                namespace: claim.namespace,
                name: claim.name,
            })
            .collect()
    };
}

/// Runs a prepare or unprepare batch as a task of its own, which the handler awaits.
///
/// The kubelet gives up on a call (its deadline, a stream reset) by dropping it, and tonic then
/// drops the handler's future. Were the batch that future, it would stop at whatever await it
/// had reached: a driver call half done, a CDI spec written but the claim still
/// `PrepareStarted`. As a task it runs to its last checkpoint write regardless, and the
/// kubelet's retry finds the finished claim (or, after a failure, the record that unprepare
/// and the next start clean up).
async fn detached<T: Send + 'static>(
    batch: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, Status> {
    use tracing::Instrument as _;
    let spawned = std::time::Instant::now();
    let batch = async move {
        tracing::debug!(
            target: "dra_sdk::timing",
            queued_us = spawned.elapsed().as_micros() as u64,
            "batch task started"
        );
        batch.await
    };
    tokio::spawn(batch.instrument(tracing::Span::current()))
        .await
        .map_err(|error| Status::internal(format!("the batch task failed: {error}")))
}

/// Records an Event for each claim of the batch that failed, with the message the kubelet
/// gets. Only hands the work to the recorder: the answer is not delayed.
fn record_failures<T>(
    events: &ClaimEvents,
    claims: &[ClaimRef],
    results: &std::collections::BTreeMap<String, Result<T, String>>,
    failure: Failure,
) {
    for (uid, result) in results {
        if let Err(message) = result
            && let Some(claim) = claims.iter().find(|claim| claim.uid == *uid)
        {
            events.record(claim, failure, message);
        }
    }
}

/// Generates the adapter for one DRA API version, `crate::proto::$pb`. `$device` builds that
/// version's `Device` defaults from a prepared device's optional share ID (v1beta1 has no
/// such field, so it ignores it).
macro_rules! dra_adapter {
    ($adapter:ident, $pb:ident, $device:expr) => {
        pub(crate) struct $adapter<D: Driver> {
            pub(crate) node: Arc<NodeService<D>>,
            /// Failure Events on the claims (off the kubelet's path).
            pub(crate) events: ClaimEvents,
        }

        #[tonic::async_trait]
        // v1beta1 has no field beyond the four set here, so its struct update is a no-op.
        #[allow(clippy::needless_update)]
        impl<D: Driver> crate::proto::$pb::dra_plugin_server::DraPlugin for $adapter<D> {
            async fn node_prepare_resources(
                &self,
                request: Request<crate::proto::$pb::NodePrepareResourcesRequest>,
            ) -> Result<Response<crate::proto::$pb::NodePrepareResourcesResponse>, Status> {
                use crate::proto::$pb as pb;
                let (claims, refused) = split_valid(claim_refs!(request.into_inner().claims));
                let requested = claims.clone();
                let node = Arc::clone(&self.node);
                let mut results = detached(async move { node.prepare(claims).await }).await?;
                record_failures(&self.events, &requested, &results, Failure::Prepare);
                // Refused claims get no Event: their namespace or name may be no object's.
                results.extend(refused.into_iter().map(|(uid, error)| (uid, Err(error))));
                let device_defaults: fn(Option<String>) -> pb::Device = $device;
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let response = match result {
                            Ok(devices) => pb::NodePrepareResourceResponse {
                                devices: devices
                                    .into_iter()
                                    .map(|device| pb::Device {
                                        request_names: device.request_names,
                                        pool_name: device.pool,
                                        device_name: device.device,
                                        cdi_device_ids: device.cdi_device_ids,
                                        ..device_defaults(device.share_id)
                                    })
                                    .collect(),
                                error: String::new(),
                            },
                            Err(error) => pb::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, response)
                    })
                    .collect();
                Ok(Response::new(pb::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<crate::proto::$pb::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<crate::proto::$pb::NodeUnprepareResourcesResponse>, Status> {
                use crate::proto::$pb as pb;
                let (claims, refused) = split_valid(claim_refs!(request.into_inner().claims));
                let requested = claims.clone();
                let node = Arc::clone(&self.node);
                let mut results = detached(async move { node.unprepare(claims).await }).await?;
                record_failures(&self.events, &requested, &results, Failure::Unprepare);
                // Refused claims get no Event: their namespace or name may be no object's.
                results.extend(refused.into_iter().map(|(uid, error)| (uid, Err(error))));
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let error = result.err().unwrap_or_default();
                        (uid, pb::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new(pb::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_adapter!(DraV1, dra_v1, |share_id| crate::proto::dra_v1::Device {
    share_id,
    ..Default::default()
});
dra_adapter!(DraV1beta1, dra_v1beta1, |_share_id| {
    crate::proto::dra_v1beta1::Device::default()
});

/// Serves `NodeWatchResources` from a driver's [`HealthSource`], in both versions of the
/// health service: a 1.37 kubelet uses `v1.DRAResourceHealth`, kubelets 1.34-1.36 know only
/// `v1alpha1.DRAResourceHealth`. The messages are the same, so one stream (built in v1alpha1
/// types) feeds both, and both see the same device states.
#[derive(Clone)]
pub(crate) struct HealthService {
    /// The driver's device health; `None` for a driver that reports none.
    pub(crate) source: Option<HealthSource>,
    /// Re-send interval without changes; well below the kubelet's 30 s staleness timeout.
    pub(crate) resend_interval: Duration,
    /// Ends the quiet stream of a driver without health when the plugin stops.
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
}

type HealthStream =
    Pin<Box<dyn Stream<Item = Result<health_pb::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl health_pb::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<health_pb::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.watch()))
    }
}

type HealthStreamV1 =
    Pin<Box<dyn Stream<Item = Result<health_v1::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStreamV1;

    async fn node_watch_resources(
        &self,
        _request: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        use futures::StreamExt as _;
        Ok(Response::new(Box::pin(
            self.watch().map(|item| item.map(to_v1)),
        )))
    }
}

/// A v1alpha1 health message in v1 types: the two versions' messages are field for field
/// the same.
fn to_v1(response: health_pb::NodeWatchResourcesResponse) -> health_v1::NodeWatchResourcesResponse {
    health_v1::NodeWatchResourcesResponse {
        devices: response
            .devices
            .into_iter()
            .map(|device| health_v1::DeviceHealth {
                device: device.device.map(|id| health_v1::DeviceIdentifier {
                    pool_name: id.pool_name,
                    device_name: id.device_name,
                }),
                // Same numbers in both enums (UNKNOWN 0, HEALTHY 1, UNHEALTHY 2).
                health: device.health,
                last_updated_time: device.last_updated_time,
                health_check_timeout_seconds: device.health_check_timeout_seconds,
                message: device.message,
            })
            .collect(),
    }
}

impl HealthService {
    /// One kubelet's health stream, whichever service version it opened.
    fn watch(&self) -> HealthStream {
        let Some(source) = &self.source else {
            // Kubelet 1.36 (seen with v1.36.2) opens this stream for every plugin, whether it
            // lists the health service or not, and after `Unimplemented` retries every 5 s,
            // forever. A driver without health gets a quiet stream instead: nothing to report,
            // no reconnect churn. It ends with the plugin, or when the kubelet goes away.
            let shutdown = self.shutdown.clone();
            return async_stream(move |sender| async move {
                tokio::select! {
                    () = shutdown.cancelled_owned() => {}
                    () = sender.closed() => {}
                }
            });
        };
        let mut updates = source.subscribe();
        let resend = self.resend_interval;
        // The stream ends with the plugin: the server's graceful shutdown waits for open
        // streams, and a driver's source never ends on its own.
        let shutdown = self.shutdown.clone();
        async_stream(move |sender| async move {
            let mut ticker = tokio::time::interval(resend);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut stamps = ChangeStamps::default();
            let mut source_gone = false;
            loop {
                let mut devices = updates.borrow_and_update().clone();
                if source_gone {
                    // Nothing will report on these devices any more: the last state is no
                    // longer known, and re-sending it would keep it fresh forever.
                    for device in &mut devices {
                        device.status = HealthStatus::Unknown;
                        device.message = SOURCE_GONE.to_owned();
                    }
                }
                let response = health_response(&devices, &mut stamps, SystemTime::now());
                if sender.send(Ok(response)).await.is_err() {
                    return; // the kubelet went away
                }
                ticker.reset();
                // Every wait also watches the kubelet's end: a stream it dropped ends its
                // task now, not at the next tick, or a kubelet reconnecting in a loop would
                // pile up one task per stream for a whole resend interval.
                if source_gone {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = sender.closed() => return,
                        _ = ticker.tick() => {}
                    }
                    continue;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = sender.closed() => return,
                    changed = updates.changed() => source_gone = changed.is_err(),
                    _ = ticker.tick() => {}
                }
            }
        })
    }
}

/// A stream fed by a task; the task ends when the receiver is dropped.
fn async_stream<F, Fut>(producer: F) -> HealthStream
where
    F: FnOnce(
        tokio::sync::mpsc::Sender<Result<health_pb::NodeWatchResourcesResponse, Status>>,
    ) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    tokio::spawn(producer(sender));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))
}

/// The kubelet truncates longer messages itself; doing it here keeps the wire small.
const MAX_HEALTH_MESSAGE: usize = 1024;

/// What the kubelet is told once a driver's health source is gone (its reporter dropped).
const SOURCE_GONE: &str = "the driver no longer reports this device's health";

/// When each device's reported state (status and message) last changed, for
/// `last_updated_time`: a re-send of an unchanged state keeps the time of the change.
#[derive(Default)]
struct ChangeStamps {
    seen: std::collections::HashMap<DeviceRef, (HealthStatus, String, i64)>,
}

impl ChangeStamps {
    fn stamp(&mut self, device: &DeviceState, message: &str, now: i64) -> i64 {
        let key = device.device.clone();
        match self.seen.get(&key) {
            Some((status, seen_message, at))
                if *status == device.status && seen_message == message =>
            {
                *at
            }
            _ => {
                self.seen
                    .insert(key, (device.status, message.to_owned(), now));
                now
            }
        }
    }
}

fn health_response(
    devices: &[DeviceState],
    stamps: &mut ChangeStamps,
    now: SystemTime,
) -> health_pb::NodeWatchResourcesResponse {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    health_pb::NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|device| {
                let message = truncate(&device.message, MAX_HEALTH_MESSAGE);
                health_pb::DeviceHealth {
                    device: Some(health_pb::DeviceIdentifier {
                        pool_name: device.device.pool.clone(),
                        device_name: device.device.name.clone(),
                    }),
                    health: match device.status {
                        HealthStatus::Unknown => health_pb::HealthStatus::Unknown,
                        HealthStatus::Healthy => health_pb::HealthStatus::Healthy,
                        HealthStatus::Unhealthy => health_pb::HealthStatus::Unhealthy,
                    } as i32,
                    last_updated_time: stamps.stamp(device, &message, now),
                    health_check_timeout_seconds: device
                        .timeout
                        .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
                        .unwrap_or(0),
                    message,
                }
            })
            .collect(),
    }
}

fn truncate(message: &str, max_chars: usize) -> String {
    match message.char_indices().nth(max_chars) {
        Some((cut, _)) => message[..cut].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_messages_are_truncated_on_char_boundaries() {
        let long = "é".repeat(2000);
        assert_eq!(truncate(&long, MAX_HEALTH_MESSAGE).chars().count(), 1024);
        assert_eq!(truncate("short", MAX_HEALTH_MESSAGE), "short");
    }

    #[test]
    fn last_updated_time_is_the_time_of_the_change_not_of_the_resend() {
        let mut stamps = ChangeStamps::default();
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        let healthy = [DeviceState::new("pool", "gpu-0", HealthStatus::Healthy)];
        let sent =
            |response: health_pb::NodeWatchResourcesResponse| response.devices[0].last_updated_time;
        assert_eq!(sent(health_response(&healthy, &mut stamps, at(100))), 100);
        assert_eq!(sent(health_response(&healthy, &mut stamps, at(110))), 100);
        let sick =
            [DeviceState::new("pool", "gpu-0", HealthStatus::Unhealthy).with_message("XID 79")];
        assert_eq!(sent(health_response(&sick, &mut stamps, at(120))), 120);
        assert_eq!(sent(health_response(&sick, &mut stamps, at(130))), 120);
        // A new message is a change too.
        let sicker =
            [DeviceState::new("pool", "gpu-0", HealthStatus::Unhealthy).with_message("XID 48")];
        assert_eq!(sent(health_response(&sicker, &mut stamps, at(140))), 140);
    }
}

//! Which primary of a Redis Cluster serves each hash slot ([`SlotMap`]), each with its
//! connection ([`Primary`]), for the per-primary pipelines (`primaries.rs`). The map comes from
//! `CLUSTER SLOTS` (through the cluster connection), read when the transport connects and
//! again, in the background, once a reply showed it out of date (a redirection, `CLUSTERDOWN`,
//! `READONLY`, a primary that failed or that the map lacks): a batch never waits for it, and a
//! stale map costs only the calls it misroutes, which go alone. Neighbours: `batching.rs` turns
//! batching off when a primary named here cannot be reached with the seed node's settings;
//! `cluster.rs` reads the slot ranges too ([`slot_ranges`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot};
use redis::{ConnectionAddr, Value};

use super::Primaries;
use crate::store::connection::Node;
use crate::store::endpoint::Endpoint;

/// Which primary serves each slot, as `CLUSTER SLOTS` said.
pub(super) struct SlotMap {
    /// Slot → index into `primaries`.
    pub(super) by_slot: HashMap<Slot, u16>,
    pub(super) primaries: Vec<Arc<Primary>>,
    /// A primary no client could be made for (its slots are not in `by_slot`), and why.
    pub(super) unusable: Option<String>,
}

/// One primary and the connection to it.
pub(super) struct Primary {
    /// `host:port`, for logs.
    pub(super) address: String,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) node: Node,
}

impl Primaries {
    /// Whether there is a map to send batches by (perhaps out of date: a stale map costs only
    /// the calls it misroutes, which go alone).
    pub(crate) fn has_map(&self) -> bool {
        self.map().is_some()
    }

    pub(super) fn map(&self) -> Option<Arc<SlotMap>> {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The map is out of date: the next batch starts reading it again.
    pub(super) fn out_of_date(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    /// Reads the map again in the background over `connection`, if it is out of date, no
    /// read is under way and batching is not paused.
    pub(crate) fn refresh(self: &Arc<Self>, connection: &ClusterConnection) {
        if self.paused()
            || !self.stale.load(Ordering::Relaxed)
            || self.reading.swap(true, Ordering::AcqRel)
        {
            return;
        }
        tracing::trace!(target: crate::telemetry::LOG_TARGET, seed = %self.seed.addr(), "reading the Redis Cluster's slot map");
        self.stale.store(false, Ordering::Relaxed);
        let (primaries, mut connection) = (self.clone(), connection.clone());
        self.io.spawn(async move {
            let slots = connection
                .route_command(
                    redis::cmd("CLUSTER").arg("SLOTS").clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                )
                .await;
            match slots {
                Ok(slots) => primaries.install(&slots),
                Err(err) => {
                    tracing::debug!(target: crate::telemetry::LOG_TARGET, "could not read the Cluster's slots: {err}");
                    primaries.out_of_date();
                }
            }
            primaries.reading.store(false, Ordering::Release);
        });
    }

    /// Takes the map a `CLUSTER SLOTS` reply gives, keeping the connections to the primaries
    /// it still names.
    pub(super) fn install(&self, slots: &Value) {
        let ranges = slot_ranges(slots);
        let old = self.map();
        let mut primaries: Vec<Arc<Primary>> = Vec::new();
        let mut by_slot = HashMap::new();
        let mut unusable = None;
        for (first, last, (host, port)) in ranges {
            let known =
                |list: &[Arc<Primary>]| list.iter().position(|p| p.host == host && p.port == port);
            let at = match known(&primaries) {
                Some(at) => at,
                None => {
                    let kept = old
                        .as_ref()
                        .and_then(|map| known(&map.primaries).map(|at| map.primaries[at].clone()));
                    let made = match kept {
                        Some(primary) => Ok(primary),
                        None => self.connect(host.clone(), port).map(Arc::new),
                    };
                    let primary = match made {
                        Ok(primary) => primary,
                        Err(why) => {
                            unusable.get_or_insert(why);
                            continue;
                        }
                    };
                    primaries.push(primary);
                    primaries.len() - 1
                }
            };
            let Ok(at) = u16::try_from(at) else {
                continue;
            };
            by_slot.extend((first..=last).filter_map(Slot::new).map(|slot| (slot, at)));
        }
        if let Some(why) = &unusable {
            self.switch_off(why.clone(), None);
        }
        *self.map.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(SlotMap {
            by_slot,
            primaries,
            unusable,
        }));
    }

    /// A primary at `host:port`, connected on first use with the seed node's settings (an
    /// error: no client can be made for it — an unknown (`?`) or empty host, or settings that
    /// do not make a client — and its slots' calls go alone).
    pub(super) fn connect(&self, host: String, port: u16) -> Result<Primary, String> {
        if host.is_empty() || host == "?" {
            return Err(format!(
                "CLUSTER SLOTS names no usable host for the primary on port {port} ({host:?})"
            ));
        }
        let addr = match self.seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.clone(), port),
        };
        let client = redis::Client::open(self.seed.clone().set_addr(addr)).map_err(|err| {
            format!("no client can be made for the Cluster primary {host}:{port}: {err}")
        })?;
        let node = Node::new(
            Arc::new(Endpoint::Fixed(client)),
            self.connect_timeout,
            self.response_timeout,
            false,
            false,
            self.io.clone(),
        );
        Ok(Primary {
            address: format!("{host}:{port}"),
            host,
            port,
            node,
        })
    }
}

/// The slot ranges of a `CLUSTER SLOTS` reply (`[[start, end, [host, port, …], replicas…],
/// …]`), each with its primary.
pub(crate) fn slot_ranges(slots: &Value) -> Vec<(u16, u16, (String, u16))> {
    let mut ranges = Vec::new();
    let Value::Array(entries) = slots else {
        return ranges;
    };
    for entry in entries {
        let Value::Array(entry) = entry else {
            continue;
        };
        let (Some(Ok(first)), Some(Ok(last))) = (
            entry.first().map(redis::from_redis_value_ref::<u16>),
            entry.get(1).map(redis::from_redis_value_ref::<u16>),
        ) else {
            continue;
        };
        let Some(Value::Array(node)) = entry.get(2) else {
            continue;
        };
        let host = match node.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => continue,
        };
        let Some(Ok(port)) = node.get(1).map(redis::from_redis_value_ref::<u16>) else {
            continue;
        };
        ranges.push((first, last, (host, port)));
    }
    ranges
}

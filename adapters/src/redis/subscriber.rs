//! The subscriber connection of a redis-rs node's release notifications (see [`redlease::notify`]).

use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
#[cfg(feature = "redis-cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use redlease::NodeError;
use redlease::notify::{Inbox, Notifier, SubscribeFuture, Subscriber};

use crate::scripts::Script;

use super::error::{classify, connect_error};

/// The servers a redis-rs subscriber connection talks to.
#[derive(Clone)]
pub(super) enum Target {
    /// One server: a RESP3 multiplexed connection, `SUBSCRIBE`.
    Standalone(Box<redis::Client>),
    /// A Redis Cluster: a RESP3 cluster connection, `SSUBSCRIBE` routed by the channel's slot.
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<redis::cluster::ClusterClient>),
}

#[derive(Clone)]
pub(super) enum SubConnection {
    Standalone(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterConnection),
}

/// The subscriber connection of a redis-rs node (see [`redlease::notify`]): opened for one inbox generation,
/// delivering pushed messages to that inbox, dropped on [`close`](Subscriber::close) or when it reports a
/// disconnection.
pub(super) struct RedisSubscriber {
    pub(super) target: Target,
    pub(super) current: Arc<Mutex<Option<(SubConnection, u64)>>>,
}

/// Not a script: names `SUBSCRIBE`/`SSUBSCRIBE` and `UNSUBSCRIBE`/`SUNSUBSCRIBE` in messages.
const SUBSCRIBE: Script = Script {
    name: "SUBSCRIBE",
    source: "",
    sha1: "",
};

pub(super) fn standalone_notifier(client: &redis::Client, max_channels: usize) -> Notifier {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let target = match redis::Client::open(info.set_redis_settings(settings)) {
        Ok(client) => Target::Standalone(Box::new(client)),
        // Cannot happen for the settings of a client that exists; then the plain client (whose subscribe
        // fails, so waiters poll).
        Err(_) => Target::Standalone(Box::new(client.clone())),
    };
    Notifier::new(
        RedisSubscriber {
            target,
            current: Arc::default(),
        },
        max_channels,
    )
}

fn lock_sub(
    m: &Mutex<Option<(SubConnection, u64)>>,
) -> std::sync::MutexGuard<'_, Option<(SubConnection, u64)>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a subscriber connection's push sender does with one push.
fn on_push(inbox: &Inbox, current: &Mutex<Option<(SubConnection, u64)>>, info: PushInfo) {
    match info.kind {
        PushKind::Message | PushKind::SMessage => {
            let bytes = |v: &Value| match v {
                Value::BulkString(b) => Some(b.clone()),
                Value::SimpleString(s) => Some(s.clone().into_bytes()),
                _ => None,
            };
            // `[channel, payload]`.
            if let [channel, payload, ..] = info.data.as_slice()
                && let (Some(channel), Some(payload)) = (bytes(channel), bytes(payload))
            {
                inbox.deliver(&channel, &payload);
            }
        }
        PushKind::Disconnection => {
            {
                let mut slot = lock_sub(current);
                if slot.as_ref().is_some_and(|(_, g)| *g == inbox.generation()) {
                    *slot = None;
                }
            }
            inbox.lost();
        }
        _ => {}
    }
}

impl RedisSubscriber {
    /// The connection of `inbox`'s generation, opened if needed.
    async fn connection(
        target: &Target,
        current: &Arc<Mutex<Option<(SubConnection, u64)>>>,
        inbox: &Inbox,
    ) -> Result<SubConnection, NodeError> {
        if let Some((conn, generation)) = &*lock_sub(current)
            && *generation == inbox.generation()
        {
            return Ok(conn.clone());
        }
        let (sink, slot) = (inbox.clone(), Arc::clone(current));
        let push = move |info: PushInfo| {
            on_push(&sink, &slot, info);
            Ok::<(), std::convert::Infallible>(())
        };
        let conn = match target {
            Target::Standalone(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
                    .set_push_sender(push);
                SubConnection::Standalone(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map_err(|e| connect_error(&SUBSCRIBE, &e))?,
                )
            }
            #[cfg(feature = "redis-cluster")]
            Target::Cluster(client) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(std::time::Duration::from_secs(2))
                    .set_push_sender(push);
                SubConnection::Cluster(
                    client
                        .get_async_connection_with_config(config)
                        .await
                        .map_err(|e| connect_error(&SUBSCRIBE, &e))?,
                )
            }
        };
        let mut slot = lock_sub(current);
        // A concurrent subscribe cannot happen (the notifier runs one command at a time); replace anything
        // older.
        *slot = Some((conn.clone(), inbox.generation()));
        Ok(conn)
    }
}

impl Subscriber for RedisSubscriber {
    fn subscribe(&self, inbox: Inbox, channel: &str) -> SubscribeFuture {
        let (target, current, channel) = (
            self.target.clone(),
            Arc::clone(&self.current),
            channel.to_owned(),
        );
        Box::pin(async move {
            let conn = Self::connection(&target, &current, &inbox).await?;
            let result = match conn {
                SubConnection::Standalone(mut c) => c.subscribe(&channel).await,
                #[cfg(feature = "redis-cluster")]
                SubConnection::Cluster(mut c) => c.ssubscribe(&channel).await,
            };
            result.map_err(|e| classify(Some(&SUBSCRIBE), &e))
        })
    }

    fn unsubscribe(&self, channel: &str) -> SubscribeFuture {
        let conn = lock_sub(&self.current).as_ref().map(|(c, _)| c.clone());
        let channel = channel.to_owned();
        Box::pin(async move {
            let result = match conn {
                None => return Ok(()),
                Some(SubConnection::Standalone(mut c)) => c.unsubscribe(&channel).await,
                #[cfg(feature = "redis-cluster")]
                Some(SubConnection::Cluster(mut c)) => c.sunsubscribe(&channel).await,
            };
            result.map_err(|e| classify(Some(&SUBSCRIBE), &e))
        })
    }

    fn close(&self) {
        // The last handle: the connection's driver ends and the server drops its subscriptions.
        let old = lock_sub(&self.current).take();
        drop(old);
    }
}

//! The subscriber client of a fred node's release notifications (see [`redlease::notify`]).

use std::sync::{Arc, Mutex};

use fred::clients::Client;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::Value;
use redlease::notify::{Inbox, SubscribeFuture, Subscriber};
use redlease::{NodeError, NodeErrorKind};
use tokio::sync::broadcast;

use crate::scripts::Script;

use super::error::classify;

/// Not a script: names `SUBSCRIBE`/`SSUBSCRIBE` and their opposites in messages.
const SUBSCRIBE: Script = Script {
    name: "SUBSCRIBE",
    source: "",
    sha1: "",
};

/// A fred subscriber client of one inbox generation, and the runtime that can end it.
type Current = Arc<Mutex<Option<(Client, u64, tokio::runtime::Handle)>>>;

/// The subscriber connection of a fred node (see [`redlease::notify`]): a client of its own (`clone_new` of
/// the node's), connected for one inbox generation. fred reconnects by itself, but a new connection has no
/// subscriptions: an error on the client's error channel reports the connection lost, and the next subscribe
/// starts a new client. fred runs on tokio: a client is ended (`QUIT`) as a task on the runtime it was
/// started on.
pub(super) struct FredSubscriber {
    pub(super) template: Client,
    pub(super) cluster: bool,
    pub(super) current: Current,
}

fn lock_current(
    current: &Current,
) -> std::sync::MutexGuard<'_, Option<(Client, u64, tokio::runtime::Handle)>> {
    current.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends a subscriber client in the background (its connections close, the server drops its subscriptions).
fn quit_later(old: Option<(Client, u64, tokio::runtime::Handle)>) {
    if let Some((client, _, handle)) = old {
        handle.spawn(async move {
            let _ = client.quit().await;
        });
    }
}

fn payload_bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Bytes(b) => Some(b.to_vec()),
        _ => None,
    }
}

impl FredSubscriber {
    async fn client(
        template: &Client,
        current: &Current,
        inbox: &Inbox,
    ) -> Result<Client, NodeError> {
        if let Some((client, generation, _)) = &*lock_current(current)
            && *generation == inbox.generation()
        {
            return Ok(client.clone());
        }
        let old = lock_current(current).take();
        quit_later(old);
        // fred runs on tokio: outside a tokio runtime there is nothing to run the listeners on (the waiters
        // then poll).
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Unsupported,
                "SUBSCRIBE: fred needs a tokio runtime to receive messages; none is current (not sent)",
            ));
        };
        let client = template.clone_new();
        // Not `on_message`: its listener ends at the first overflow of fred's bounded message queue (32 by
        // default), after which every message would be lost. This one survives it and reports the gap.
        let (sink, mut messages) = (inbox.clone(), client.message_rx());
        handle.spawn(async move {
            loop {
                match messages.recv().await {
                    Ok(msg) => {
                        if let Some(payload) = payload_bytes(&msg.value) {
                            sink.deliver(msg.channel.as_bytes(), &payload);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => sink.missed(),
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        // A connection error (or errors missed in an overflow) means the subscriptions may be gone: the
        // client is ended and the notifier subscribes again on a new one.
        let (sink, slot, mut errors) = (inbox.clone(), Arc::clone(current), client.error_rx());
        handle.spawn(async move {
            loop {
                match errors.recv().await {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
                let mine = {
                    let mut slot = lock_current(&slot);
                    if slot
                        .as_ref()
                        .is_some_and(|(_, g, _)| *g == sink.generation())
                    {
                        slot.take()
                    } else {
                        None
                    }
                };
                if mine.is_some() {
                    quit_later(mine);
                    sink.lost();
                    return;
                }
            }
        });
        let connected = client.init().await;
        if let Err(e) = connected {
            let _ = client.quit().await;
            return Err(classify(Some(&SUBSCRIBE), &e));
        }
        *lock_current(current) = Some((client.clone(), inbox.generation(), handle));
        Ok(client)
    }
}

impl Subscriber for FredSubscriber {
    fn subscribe(&self, inbox: Inbox, channel: &str) -> SubscribeFuture {
        let (template, current, cluster, channel) = (
            self.template.clone(),
            Arc::clone(&self.current),
            self.cluster,
            channel.to_owned(),
        );
        Box::pin(async move {
            let client = Self::client(&template, &current, &inbox).await?;
            let result = if cluster {
                client.ssubscribe(channel).await
            } else {
                // fred takes `SUBSCRIBE` as answered once written (its confirmation arrives out of band), so
                // the server may not have subscribed yet: a release published meanwhile would wake nobody,
                // although the waiter was told it listens. A `PING` behind it on the same connection (allowed
                // in subscriber mode) answers only after the server ran the `SUBSCRIBE`. (`SSUBSCRIBE` waits
                // for its own reply in fred.)
                match client.subscribe(channel).await {
                    Ok(()) => client.ping::<Value>(None).await.map(|_| ()),
                    Err(e) => Err(e),
                }
            };
            result.map_err(|e| classify(Some(&SUBSCRIBE), &e))
        })
    }

    fn unsubscribe(&self, channel: &str) -> SubscribeFuture {
        let client = lock_current(&self.current)
            .as_ref()
            .map(|(c, _, _)| c.clone());
        let (cluster, channel) = (self.cluster, channel.to_owned());
        Box::pin(async move {
            let Some(client) = client else {
                return Ok(());
            };
            let result = if cluster {
                client.sunsubscribe(channel).await
            } else {
                client.unsubscribe(channel).await
            };
            result.map_err(|e| classify(Some(&SUBSCRIBE), &e))
        })
    }

    fn close(&self) {
        let old = lock_current(&self.current).take();
        quit_later(old);
    }
}
